"""The core without its extras: save and recall work, and each extra that is missing is one line naming
its pip install. The extras' packages are made unimportable in a subprocess (``sys.modules[name] =
None``), as in a ``pip install tinycontext`` environment; CI also runs scripts/core_smoke.py in a fresh
virtual environment holding only the core install. The real bundled model embeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from core_smoke import EXTRA_MODULES  # noqa: E402

BLOCK = f"import sys\nfor name in {EXTRA_MODULES!r}:\n    sys.modules[name] = None\n"


def run_without_extras(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    env.update(TINYCONTEXT_MEMORY_DB_PATH=str(tmp_path / "m.db"), TINYCONTEXT_MODELS_DIR=str(tmp_path / "models"),
               TINYCONTEXT_CONFIG_PATH="", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def test_save_and_recall_need_no_extra(tmp_path):
    done = run_without_extras(f"import runpy\nrunpy.run_path({str(REPO / 'scripts' / 'core_smoke.py')!r}, run_name='__main__')", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recalled ['Alice prefers tea over coffee'" in done.stdout and "extra stacks imported: none" in done.stdout


@pytest.mark.parametrize("command, extra", [(["mcp"], "mcp"), (["search", "tea"], "web"), (["scrape", "https://example.com/"], "web"),
                                            (["serve"], "mcp")])
def test_a_missing_extra_is_one_line_naming_the_install(tmp_path, command, extra):
    done = run_without_extras(f"from tinycontext.cli.commands import main\nsys.argv = ['tinycontext', *{command!r}]\nraise SystemExit(main())", tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("missing_extra: ") and f"pip install 'tinycontext[{extra}]'" in lines[0]

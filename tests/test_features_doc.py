"""docs/features.md: every "check it" command marked offline runs as written (in a fresh data folder, through the
real CLI) and exits as the table says; the others at least name a subcommand and flags that exist."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tinycontext.cli.commands import main

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "features.md"
ROW = re.compile(r"^\| (?P<feature>[^|]+) \| [^|]+ \| `(?P<command>(?:[^`]|``)+)`.*\| (?P<runs>offline(?:, exits \d+)?|server|setup) \| "
                 r"\[[^]]+\]\((?P<page>[^)]+)\) \| `(?P<proof>[^`]+)` \|$")
ISSUE_26 = ("OpenTelemetry", "upstream proxies", "activity records", "management views")


def rows() -> list[dict[str, str]]:
    table = [line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| ") and not line.startswith("| feature")]
    found = [ROW.match(line) for line in table]
    assert all(found), [line for line, m in zip(table, found) if not m]
    return [m.groupdict() for m in found]


def test_the_table_is_well_formed_and_has_issue_26_rows():
    table = rows()
    assert len(table) >= 15
    features = [row["feature"] for row in table]
    assert len(set(features)) == len(features) and all(name in features for name in ISSUE_26)
    for row in table:
        assert (REPO / row["proof"]).is_file(), row["proof"]
        assert (PAGE.parent / row["page"].split("#")[0]).is_file(), row["page"]


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """A stranger's shell after setup: `tinycontext` and `python` are this checkout's, run from a checkout-like folder."""
    home = tmp_path_factory.mktemp("stranger")
    bin_dir = home / "bin"
    bin_dir.mkdir()
    for name, target in (("tinycontext", f'"{sys.executable}" -m tinycontext.cli.commands'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (bin_dir / name).chmod(0o755)
    (home / "tests").symlink_to(REPO / "tests")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TINYCONTEXT_", "OTEL_"))}
    env = {**base, "PATH": f"{bin_dir}:{base.get('PATH', '')}", "PYTHONPATH": str(REPO), "HOME": str(home),
           "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
           "TINYCONTEXT_MEMORY_DB_PATH": str(home / "memory.db")}

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", command], cwd=home, env=env, capture_output=True, text=True, timeout=120, check=False)
    return run


def test_every_offline_command_runs_as_written_and_prints_what_the_row_says(shell):
    # In table order: the CLI row saves memory 1, which the supersession row then supersedes.
    out: dict[str, str] = {}
    done_by_command: dict[str, subprocess.CompletedProcess] = {}
    for row in rows():
        if row["runs"].startswith("offline"):
            # The browser row's command is the readiness row's: one doctor run (the slowest command) serves both.
            done = done_by_command.get(row["command"]) or done_by_command.setdefault(row["command"], shell(row["command"]))
            expected = int(row["runs"].rsplit(" ", 1)[1]) if "exits" in row["runs"] else 0
            assert done.returncode == expected, (row["feature"], done.stdout[-2000:], done.stderr[-2000:])
            assert "Traceback" not in done.stderr, row["feature"]
            out[row["feature"]] = done.stdout + done.stderr
    assert "Alice prefers tea" in out["memory library"] and "Bob's birthday is May 3" in out["CLI"]
    assert "May 4" in out["supersession"] and "May 3" in out["supersession"]  # the old fact only with --include-superseded
    assert re.search(r"\[  ok\] proxies +1 upstream proxy \(http://127\.0\.0\.1:3128\)", out["upstream proxies"])
    assert re.search(r"\[  ok\] telemetry +the servers export traces over OTLP", out["OpenTelemetry"])
    assert re.search(r"\[  ok\] browser ", out["browser tools"]) or "[skip] browser" in out["browser tools"]
    assert "blocked: 127.0.0.1 resolves to loopback" in out["web scrape with SSRF guard"]
    assert "config_error: Refusing to serve management over HTTP without access control" in out["management views"]


def test_the_other_commands_name_real_subcommands_and_flags(capsys):
    for row in rows():
        words = shlex.split(row["command"])
        if row["runs"] in ("server", "setup") and "tinycontext" in words:
            words = words[words.index("tinycontext") + 1:]
            with pytest.raises(SystemExit) as exited:  # in process: the same parser, without a second interpreter start
                main([words[0], "--help"])
            help_text = capsys.readouterr().out
            assert exited.value.code == 0 and help_text.startswith(f"usage: tinycontext {words[0]}"), row["feature"]
            for flag in (w for w in words if w.startswith("--")):
                assert flag in help_text, (row["feature"], flag)

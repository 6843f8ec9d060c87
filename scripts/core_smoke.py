"""The core alone: save and recall with nothing but `pip install tinycontext` (no web, server or harness stacks).

Run by CI in a fresh virtual environment holding only `pip install .` (``--strict``: fails if any extra's
stack is installed there), and by tests/test_slim_core.py with those stacks made unimportable. Exits
non-zero when save or recall fails, or when recall imported any of them.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

# What the extras bring (mcp/server, web, browser, eval): the core must work without any of them.
EXTRA_MODULES = ("mcp", "fastapi", "uvicorn", "starlette", "httpx", "trafilatura", "lxml", "pypdf", "ddgs",
                 "playwright", "hydra", "pandas", "ir_measures", "matplotlib", "ray", "jupyterlab")


def main(strict: bool) -> int:
    present = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is not None]
    if strict and present:
        print(f"not a core-only environment, these are installed: {', '.join(present)}", file=sys.stderr)
        return 2
    from tinycontext import MemoryInput, TinyContextConfig, recall_memories, save_memories

    with tempfile.TemporaryDirectory() as tmp:
        config = TinyContextConfig(memory_db_path=Path(tmp) / "memory.db", models_dir=Path(tmp) / "models")
        saved = save_memories([MemoryInput(content="Alice prefers tea over coffee", tags=["prefs"]),
                               MemoryInput(content="The deploy runs every Friday at noon")], session_id="alice", config=config)
        result = recall_memories("what does Alice drink?", session_id="alice", max_tokens=200, config=config)
    loaded = sorted(name for name in EXTRA_MODULES if sys.modules.get(name) is not None)
    print(f"saved {len(saved['ids'])}, recalled {[m['content'] for m in result['memories']]}, mode {result['mode']}, "
          f"extra stacks imported: {loaded or 'none'}")
    ok = result["memories"] and result["memories"][0]["content"].startswith("Alice") and result["mode"] == "hybrid" and not loaded
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(strict="--strict" in sys.argv))

"""Fingerprints of the code that shapes results, so that no cache outlives the code it came from.

Cache keys hash the source text itself (not a version string, not only a git commit): an edit to a
loader's text function, the engine or the harness changes the key even when it is not committed.
The manifest also records the git commit, whether the tree is dirty and a hash of the dirty diff.
"""

from __future__ import annotations

import hashlib
import inspect
import subprocess
from pathlib import Path

import tinycontext

import evals

HARNESS_DIR = Path(evals.__file__).resolve().parent
ENGINE_DIR = Path(tinycontext.__file__).resolve().parent


def sha256_files(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _tree_hash(root: Path) -> str:
    """Every .py file under ``root``, by relative name and content (read fresh: edits count at once)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def engine_source() -> str:
    """The engine package: storage, ranking, fusion, budgeting, embedding."""
    return _tree_hash(ENGINE_DIR)


def harness_source() -> str:
    return _tree_hash(HARNESS_DIR)


def module_source(obj) -> str:
    """The source file that defines ``obj`` (a loader function, the Embedder class...)."""
    file = inspect.getsourcefile(inspect.getmodule(obj))
    return sha256_files(Path(file)) if file else ""


def _git(repo: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", repo, *args], capture_output=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "replace")


def git_state(repo: Path = HARNESS_DIR.parent) -> dict:
    """Commit, dirty flag and a hash of the uncommitted diff (None outside a git checkout)."""
    commit = _git(str(repo), "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff_sha256": None}
    status = _git(str(repo), "status", "--porcelain", "--untracked-files=no") or ""
    diff = _git(str(repo), "diff", "HEAD") or ""
    return {"commit": commit.strip(), "dirty": bool(status.strip()),
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None}

"""The harness uses only tinycontext's public API: names exported by ``tinycontext/__init__.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import tinycontext

EVALS = Path(__file__).resolve().parents[1] / "evals"


def private_uses(source: str) -> list[str]:
    """Every import of tinycontext that is not ``from tinycontext import <public name>``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tinycontext":
            if node.module != "tinycontext":
                bad.append(f"from {node.module} import ...")
            bad += [f"tinycontext.{a.name}" for a in node.names if a.name.startswith("_") or a.name not in tinycontext.__all__]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("tinycontext.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tinycontext":
            dunder = node.attr.startswith("__") and node.attr.endswith("__")  # module facts: __file__, __version__
            if not dunder and node.attr not in tinycontext.__all__:
                bad.append(f"tinycontext.{node.attr}")
    return bad


def test_the_checker_catches_private_imports():
    assert private_uses("from tinycontext.models.embedder import Embedder") == ["from tinycontext.models.embedder import ..."]
    assert private_uses("from tinycontext import _private") == ["tinycontext._private"]
    assert private_uses("import tinycontext.memory.store") == ["tinycontext.memory.store"]
    assert private_uses("import tinycontext\ntinycontext.memory.engine._QUERY_POOL") == ["tinycontext.memory"]
    assert private_uses("from tinycontext import MemoryEngine, Embedder\nimport tinycontext") == []


def test_evals_imports_only_public_names():
    files = sorted(EVALS.rglob("*.py"))
    assert files
    found = {str(f.relative_to(EVALS)): private_uses(f.read_text(encoding="utf-8")) for f in files}
    assert {f: uses for f, uses in found.items() if uses} == {}

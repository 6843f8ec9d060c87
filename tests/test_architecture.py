"""The package's shape, read from its own imports: no import cycles, and no import that goes upward.

Every import counts (module level, inside functions, under ``TYPE_CHECKING``): each is a dependency a
reader has to follow. Parts and layers, lowest first:

- ground: ``config``, ``errors``, ``sqlite``, ``telemetry`` (OpenTelemetry API, no-op without a provider), ``version``;
- services: ``models`` (embedders), ``retrieval`` (recall's stages), ``budget`` (tokens, rendering), ``activity`` (activity records);
- capabilities: ``memory`` (the engine and its store), ``web`` (web evidence); they do not import each other;
- adapters: ``servers`` (MCP, REST), ``cli``, and the public API in ``tinycontext/__init__.py``.

A part may import its own modules and the parts of lower layers; parts of one layer may also use
each other, as long as the parts' graph stays acyclic.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tinycontext"
MAX_MODULE_LINES = 600  # past this a module holds more than one job: split it by responsibility
LAYERS = {
    "config": 0, "errors": 0, "sqlite": 0, "telemetry": 0, "version": 0,
    "models": 1, "retrieval": 1, "budget": 1, "activity": 1,
    "memory": 2, "web": 2,
    "servers": 3, "cli": 3, "": 3, "__main__": 3,  # "": tinycontext/__init__.py
}
LAYER_NAMES = ("ground", "services", "capabilities", "adapters")
SIDEWAYS_OK = {0, 1, 3}  # layers whose parts may import each other (acyclically): not the capabilities


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name (without the package's own name) -> file, for every module under ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, from every import statement in its source."""
    modules = module_names(root)
    package = root.name

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = [p for p in here if p]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1] if node.level > 1 else here
                    parent = ".".join(base + ([node.module] if node.module else []))
                else:
                    parent = node.module or ""
                    if parent != package and not parent.startswith(package + "."):
                        continue
                    parent = parent[len(package) + 1:]
                # ``from x import y`` names module x.y when there is one, else an attribute of x.
                targets = [f"{package}.{parent}.{a.name}".replace("..", ".") if f"{parent}.{a.name}".strip(".") in modules
                           else f"{package}.{parent}".rstrip(".") for a in node.names]
            else:
                continue
            for target in targets:
                if target == package or target.startswith(package + "."):
                    found = known(target[len(package) + 1:])
                    if found != name:
                        graph[name].add(found)
    return graph


def part(module: str) -> str:
    return module.split(".")[0]


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return None


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break the layering, as readable lines."""
    wrong = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = LAYERS.get(part(target)), LAYERS.get(part(source))
            if part(source) == part(target):
                continue
            if low is None or high is None:
                wrong.append(f"{source} -> {target}: {part(target) if low is None else part(source)!r} has no layer in LAYERS")
            elif low > high or (low == high and low not in SIDEWAYS_OK):
                wrong.append(f"{source} ({LAYER_NAMES[high]}) -> {target} ({LAYER_NAMES[low]})")
    return wrong


def parts_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for source, targets in graph.items():
        out.setdefault(part(source), set()).update(part(t) for t in targets if part(t) != part(source))
    return out


def test_no_import_cycle_between_modules():
    found = cycle(import_graph(PACKAGE))
    assert found is None, "import cycle: " + " -> ".join(found)


def test_no_import_cycle_between_parts():
    found = cycle(parts_graph(import_graph(PACKAGE)))
    assert found is None, "the package's parts import each other in a cycle: " + " -> ".join(found)


def test_no_upward_import():
    assert upward(import_graph(PACKAGE)) == []


def test_the_web_package_does_not_import_the_servers():
    graph = import_graph(PACKAGE)
    assert not {(s, t) for s, ts in graph.items() for t in ts if part(s) == "web" and part(t) in ("servers", "cli", "memory")}


def test_no_module_is_over_the_line_limit():
    long = {str(path.relative_to(REPO)): lines for folder in (PACKAGE, REPO / "evals") for path in sorted(folder.rglob("*.py"))
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines (split them by responsibility): {long}"


def test_every_part_has_a_docstring():
    for path in [*PACKAGE.glob("*/__init__.py"), *PACKAGE.glob("*.py")]:
        assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{path.relative_to(PACKAGE)} has no docstring"


@pytest.fixture
def toy(tmp_path):
    """A small package on disk, to show the checks see function-level and TYPE_CHECKING imports."""
    root = tmp_path / "toy"
    for folder in ("memory", "retrieval", "web", "servers"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text('"""x"""\n')
    (root / "__init__.py").write_text('"""x"""\n')
    (root / "errors.py").write_text("class E(Exception): ...\n")
    (root / "retrieval" / "fusion.py").write_text("from ..errors import E\n")
    (root / "memory" / "engine.py").write_text("from ..retrieval import fusion\n")
    return root


def test_the_checks_see_a_function_level_cycle(toy):
    (toy / "retrieval" / "fusion.py").write_text("def f():\n    from ..memory.engine import g\n")
    graph = import_graph(toy)
    assert graph["retrieval.fusion"] == {"memory.engine"} and graph["memory.engine"] == {"retrieval.fusion"}
    assert cycle(graph) is not None
    assert upward(graph) == ["retrieval.fusion (services) -> memory.engine (capabilities)"]


def test_the_checks_see_a_type_checking_import_and_a_capability_importing_an_adapter(toy):
    (toy / "servers" / "mcp.py").write_text("from ..errors import E\n")
    (toy / "web" / "tools.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy.servers.mcp import E\n")
    graph = import_graph(toy)
    assert graph["web.tools"] == {"servers.mcp"}
    assert cycle(graph) is None
    assert upward(graph) == ["web.tools (capabilities) -> servers.mcp (adapters)"]

"""pyproject.toml declares what the package imports (issue 19): an install that resolves only what is
declared, with the pip people have (Debian 12's pip 23), must be able to import every module."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, set[str]]:
    """Distribution name -> the groups ('core' or an extra) that declare it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    out: dict[str, set[str]] = {}
    for group, requirements in groups.items():
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)
            out.setdefault(canonical(name), set()).add(group)
    return out


def imported_modules() -> set[str]:
    modules = set()
    for path in (REPO / "tinycontext").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "tinycontext"}


def test_every_imported_distribution_is_declared():
    names = declared()
    distributions = packages_distributions()
    missing = {module: distributions.get(module) for module in imported_modules()
               if not any(canonical(d) in names for d in distributions.get(module, [module]))}
    assert not missing, f"imported by tinycontext but not in pyproject.toml: {missing}"


def test_lxml_html_clean_is_declared_beside_trafilatura():
    """justext (under trafilatura) imports lxml.html.clean and asks for it as lxml[html_clean], which pip
    before 24 does not match: the package must name lxml_html_clean itself, wherever trafilatura is."""
    names = declared()
    assert names["trafilatura"] <= names["lxml-html-clean"]

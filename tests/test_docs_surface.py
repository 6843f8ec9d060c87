"""Docs that match the code: README's tool and route lists and the tables of docs/mcp.md and docs/rest.md are
what the servers themselves list, the MCP and REST pages' commands run after setup.sh (which puts nothing on PATH), and /docs
works without a network."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import anyio
from fastapi.testclient import TestClient

from tinycontext import TinyContextConfig
from tinycontext.servers import tools
from tinycontext.servers.fastapi_server import create_app, route_reference
from tinycontext.servers.guard import ServeSettings
from tinycontext.servers.mcp_server import build_server

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "docs" / "mcp.md", REPO / "docs" / "rest.md"]


def block(path: Path, name: str) -> str:
    text = path.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert found, f"{path.name} has no {name} block"
    return found[1]


def unwrap(text: str) -> str:
    return " ".join(text.split())


def test_readme_lists_the_tools_the_mcp_server_lists(tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", tools="all")
    listed = [t.name for t in anyio.run(build_server(config).list_tools)]
    capability = {spec.name: spec.capability for spec in tools.specs(config)}
    default = TinyContextConfig.model_fields["tools"].default
    lines = [f"- `{c}`{' (default)' if c in default else ''}: " + ", ".join(f"`{n}`" for n in listed if capability[n] == c)
             for c in tools.CAPABILITIES]
    assert block(REPO / "README.md", "mcp-tools") == "\n".join(lines)


def test_readme_lists_the_routes_the_rest_app_serves(tmp_path):
    app = create_app(TinyContextConfig(memory_db_path=tmp_path / "m.db"), settings=ServeSettings())
    routes = ", ".join(f"`{method.upper()} {path}`" for path, ops in app.openapi()["paths"].items() for method in ops)
    assert unwrap(block(REPO / "README.md", "rest-routes")) == routes


def test_reference_tables_are_generated_from_the_servers():
    assert block(REPO / "docs" / "mcp.md", "tools-table") == tools.reference()
    assert block(REPO / "docs" / "rest.md", "rest-routes-table") == route_reference()


BARE = re.compile(r"(^\s*|[|;&]\s*|\$\(|\s--\s+)(?:[A-Z_]+=\S+\s+)*(tinycontext|python3?|jupyter|uvicorn|pytest)(?=\s|$)")


def bare_commands(markdown: str) -> list[str]:
    """Commands in ```bash blocks that a clean shell cannot find after setup.sh (it puts nothing on PATH)."""
    found = []
    for code in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in code.splitlines():
            command = line.partition(" #")[0]
            if BARE.search(command):
                found.append(line)
    return found


def test_quick_starts_name_the_venv():
    assert bare_commands(textwrap.dedent("""\
        ```bash
        tinycontext doctor
        cat x | tinycontext save -
        X=1 python -m evals.run   # a comment may say python
        claude mcp add tinycontext -- tinycontext mcp
        .venv/bin/tinycontext doctor  # fine
        ```
        """)) == ["tinycontext doctor", "cat x | tinycontext save -", "X=1 python -m evals.run   # a comment may say python",
                  "claude mcp add tinycontext -- tinycontext mcp"]
    for page in PAGES:
        assert bare_commands(page.read_text(encoding="utf-8")) == [], page.name
    # README's quick starts run in the installed environment, and say how to enter it after setup.sh.
    assert "source .venv/bin/activate" in (REPO / "README.md").read_text(encoding="utf-8")


def test_api_docs_are_served_without_a_cdn(tmp_path):
    client = TestClient(create_app(TinyContextConfig(memory_db_path=tmp_path / "m.db"), settings=ServeSettings()),
                        base_url="http://127.0.0.1")
    for page in ("/docs", "/redoc"):
        html = client.get(page)
        assert html.status_code == 200
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text) + re.findall(r"url: *'([^']+)'", html.text)
        assert assets and all(a.startswith("/") for a in assets), assets  # nothing from another host
        for asset in assets:
            fetched = client.get(asset)
            assert fetched.status_code == 200 and len(fetched.content) > 100, asset

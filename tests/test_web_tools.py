"""The web tools through a real MCP client (in memory and over stdio), REST and the CLI, against
pages and a fake SearXNG served on loopback. Answers must fit max_tokens as received."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.memory import create_connected_server_and_client_session

from netguard import LocalServer, loopback_only, send  # noqa: F401  (fixture)
from test_web_scrape import ARTICLE, html
from test_web_search import FakeSearx, no_real_ddgs  # noqa: F401  (autouse fixture)
from tinycontext import TinyContextConfig
from tinycontext.budget.tokens import TokenCounter
from tinycontext.cli.commands import main
from tinycontext.budget.render import to_json
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.mcp_server import build_server

WEB_TOOLS = {"search", "scrape_urls", "current_datetime"}
COUNTER = TokenCounter()


@pytest.fixture
def site():
    with LocalServer({"/rivers": html(ARTICLE), "/search": FakeSearx(), "/missing": lambda h: send(h, 404, b"", "text/plain")}) as server:
        yield server


def web_config(tmp_path, site, **extra) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, search_backend="searxng",
                             searxng_url=site.url(""), tools=("memory", "web"), **extra)


def received(result) -> tuple[int, int]:
    text = "\n".join(block.text for block in result.content)
    return COUNTER.count(text), COUNTER.count(to_json(result.structuredContent))


def passage_keys(answer: dict) -> set[str]:
    """Every key of every passage of the answer: {text, start} (its end is start + len(text); the text frames headings)."""
    return {key for r in answer["results"] for p in r.get("passages", []) for key in p}


def test_mcp_tools_fit_the_budget_as_received(loopback_only, tmp_path, site):
    server = build_server(web_config(tmp_path, site))

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert WEB_TOOLS <= set(tools)
            assert tools["scrape_urls"].annotations.openWorldHint is True
            for budget in (150, 400, 1500):
                result = await client.call_tool("scrape_urls", {"items": [
                    {"url": site.url("/rivers"), "query": "How long is the Volga?"}, {"url": site.url("/missing")}],
                    "max_tokens": budget})
                assert not result.isError, result.content[0].text
                assert max(received(result)) <= budget
                assert passage_keys(result.structuredContent) == {"text", "start"}
                ok, missing = result.structuredContent["results"]
                assert ok["outcome"] == "ok" and missing == {"url": site.url("/missing"), "outcome": "http_error",
                                                            "status": 404, "detail": "HTTP 404 Not Found"}
                if budget >= 400:
                    assert "3,530 kilometres" in result.content[0].text
            found = await client.call_tool("search", {"items": [{"query": "danube", "domains": ["wikipedia.org"]}],
                                                      "max_tokens": 200})
            assert not found.isError and max(received(found)) <= 200
            assert found.structuredContent["searches"][0]["results"][0]["url"] == "https://en.wikipedia.org/wiki/Danube"
            now = await client.call_tool("current_datetime", {})
            assert datetime.fromisoformat(now.structuredContent["utc"]).tzinfo is not None
            bad = await client.call_tool("scrape_urls", {"items": []})
            assert bad.isError and bad.content[0].text.startswith("invalid_input:")
            small = await client.call_tool("scrape_urls", {"items": [{"url": site.url("/rivers")}], "max_tokens": 5})
            assert small.isError and small.content[0].text.startswith("recall_budget:")

    anyio.run(scenario)


def test_web_tools_group_can_be_switched_off(tmp_path, site):
    server = build_server(web_config(tmp_path, site, web_tools=False))

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert not names & WEB_TOOLS and "recall_memories" in names

    anyio.run(scenario)
    client = TestClient(create_app(web_config(tmp_path, site, web_tools=False)), base_url="http://127.0.0.1")
    assert client.post("/scrape_urls", json={"items": [{"url": site.url("/rivers")}]}).status_code == 404


def test_rest_endpoints(loopback_only, tmp_path, site):
    client = TestClient(create_app(web_config(tmp_path, site)), base_url="http://127.0.0.1")
    response = client.post("/scrape_urls", json={"items": [{"url": site.url("/rivers"), "query": "Rhine floods"}], "max_tokens": 300})
    assert response.status_code == 200, response.text
    assert COUNTER.count(response.text) <= 300
    body = response.json()
    assert "text" not in body and any("Rhine" in p["text"] for p in body["results"][0]["passages"])
    assert passage_keys(body) == {"text", "start"}
    found = client.post("/search", json={"items": [{"query": "danube"}], "max_tokens": 300})
    assert found.status_code == 200 and COUNTER.count(found.text) <= 300
    assert found.json()["searches"][0]["outcome"] == "ok"
    assert client.get("/current_datetime").json()["utc"].endswith("+00:00")
    assert client.post("/scrape_urls", json={"items": []}).json()["code"] == "invalid_input"
    assert client.post("/scrape_urls", json={"items": [{"url": 5}]}).status_code == 422


def test_cli_scrape_and_search(loopback_only, tmp_path, site, env, capsys, monkeypatch):
    monkeypatch.setenv("TINYCONTEXT_ALLOW_PRIVATE_HOSTS", "true")
    monkeypatch.setenv("TINYCONTEXT_SEARCH_BACKEND", "searxng")
    monkeypatch.setenv("TINYCONTEXT_SEARXNG_URL", site.url(""))
    assert main(["scrape", site.url("/rivers"), "--query", "Danube capitals", "--max-tokens", "250"]) == 0
    out = capsys.readouterr().out
    assert "Budapest" in out and COUNTER.count(out) <= 251
    assert main(["scrape", site.url("/rivers"), "--max-tokens", "200", "--json"]) == 0
    out = capsys.readouterr().out
    answer = json.loads(out)
    assert answer["results"][0]["passages"][0]["text"].startswith("Europe has thousands") and answer["truncated"]
    assert COUNTER.count(out) <= 201 and passage_keys(answer) == {"text", "start"}
    assert main(["search", "danube", "--domain", "example.com"]) == 0
    assert "travel.example.com" in capsys.readouterr().out


def test_stdio_server_reads_allow_private_hosts_from_the_environment(tmp_path, site):
    (tmp_path / "config.json").write_text("{}")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    env = {**base, "TINYCONTEXT_CONFIG_PATH": str(tmp_path / "config.json"), "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "m.db"),
           "TINYCONTEXT_TOOLS": "web"}

    async def call(extra: dict) -> dict:
        params = StdioServerParameters(command=sys.executable, args=["-m", "tinycontext.cli.commands", "mcp"], env={**env, **extra})
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("scrape_urls", {"items": [{"url": site.url("/rivers"), "query": "Volga"}],
                                                                 "max_tokens": 500})
                return result.structuredContent

    refused = anyio.run(call, {})
    assert refused["results"][0]["outcome"] == "blocked"
    allowed = anyio.run(call, {"TINYCONTEXT_ALLOW_PRIVATE_HOSTS": "true"})
    assert allowed["results"][0]["outcome"] == "ok"
    assert any("Caspian" in p["text"] for p in allowed["results"][0]["passages"])


def test_servers_load_one_model_for_memory_and_web(loopback_only, tmp_path, site, monkeypatch):
    """scrape_urls ranks with the memory engine's embedder (same model): the model is loaded once."""
    from conftest import HashEmbedder
    from tinycontext.models import backends as embedders
    from tinycontext import close_engines

    loads = []
    monkeypatch.setattr(embedders, "create_embedder", lambda config: loads.append(config) or HashEmbedder())
    item = {"url": site.url("/rivers"), "query": "How long is the Volga?"}

    async def scenario():
        async with create_connected_server_and_client_session(build_server(web_config(tmp_path / "mcp", site))._mcp_server) as client:
            assert not (await client.call_tool("recall_memories", {"query": "rivers"})).isError
            result = await client.call_tool("scrape_urls", {"items": [item], "max_tokens": 500})
            assert "3,530 kilometres" in result.content[0].text

    try:
        anyio.run(scenario)
        assert len(loads) == 1
        client = TestClient(create_app(web_config(tmp_path / "rest", site)), base_url="http://127.0.0.1")
        assert client.post("/scrape_urls", json={"items": [item], "max_tokens": 500}).status_code == 200
        assert client.post("/recall_memories", json={"query": "rivers"}).status_code == 200
        assert len(loads) == 2  # one per configuration (the MCP one and the REST one), not one per tool
    finally:
        close_engines()

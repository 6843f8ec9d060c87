"""The MCP surface a client can introspect: an outputSchema on every tool with matching structured
content (the SDK client checks each result against it), resources, instructions, the engine opened
at server start over HTTP, and the MCP Inspector CLI listing the tools of the stdio server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import jsonschema
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.memory import create_connected_server_and_client_session

from tinycontext import TinyContextConfig, close_engines
from tinycontext.servers import mcp_server
from tinycontext.servers.http import ServeSettings, background, mcp_app
from tinycontext.servers.mcp_server import build_server


@pytest.fixture
def config(tmp_path):
    yield TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models")
    close_engines()


def test_every_tool_has_an_output_schema_its_results_match(config):
    # The web tools answer without a packet leaving the machine: SearXNG unconfigured, a refused address.
    server = build_server(config.model_copy(update={"search_backend": "searxng", "searxng_url": ""}))

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            init_instructions = server._mcp_server.instructions
            assert "recall_memories" in init_instructions and "save_memories" in init_instructions
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert all(t.outputSchema for t in tools.values()), [n for n, t in tools.items() if not t.outputSchema]
            results = {}

            async def call(name, arguments):
                # ClientSession.call_tool itself validates structuredContent against outputSchema.
                result = await client.call_tool(name, arguments)
                assert not result.isError, result.content[0].text
                jsonschema.validate(result.structuredContent, tools[name].outputSchema)
                results.setdefault(name, []).append(result.structuredContent)
                return result.structuredContent

            saved = await call("save_memories", {"session_id": "proj", "memories": [
                {"content": "The API is written in Go", "tags": ["stack"], "metadata": {"source": "chat"}},
                {"content": "The API is written in Go"}, {"content": "Releases ship on Thursdays", "ttl_seconds": 3600}]})
            first = saved["ids"][0]
            await call("recall_memories", {"query": "what language is the API in"})
            await call("recall_memories", {"query": "releases", "detail": "full", "filters": {"tags_any": ["stack"]}})
            await call("recall_memories", {"query": "API", "max_tokens": 64})
            await call("update_memory", {"id": first, "content": "The API is written in Rust"})
            await call("get_memory", {"id": first})
            await call("list_memories", {"order": "oldest"})
            await call("list_memories", {"detail": "full", "limit": 1})
            await call("list_sessions", {})
            await call("delete_memories", {"session_id": "proj"})
            await call("delete_memory", {"id": first})
            await call("delete_memories", {"session_id": "proj", "dry_run": False, "confirm": 1})
            assert (await call("search", {"items": [{"query": "sqlite"}]}))["searches"][0]["outcome"] == "unavailable"
            assert (await call("scrape_urls", {"items": [{"url": "http://10.0.0.1/"}]}))["results"][0]["outcome"] == "blocked"
            await call("current_datetime", {})
            assert set(results) == set(tools) - {"browser_navigate", "browser_act"}  # the browser has its own tests

            resources = {str(r.uri) for r in (await client.list_resources()).resources}
            assert resources == {"tinycontext://sessions", "tinycontext://stats"}
            sessions = json.loads((await client.read_resource("tinycontext://sessions")).contents[0].text)
            assert sessions["sessions"][0]["session_id"] == "proj" and sessions["sessions"][0]["memories"] == 0
            stats = json.loads((await client.read_resource("tinycontext://stats")).contents[0].text)
            assert stats["search_mode"] == "hybrid" and stats["schema_version"] >= 4 and stats["embedder"]["dimensions"] == 384

    anyio.run(scenario)


def test_http_opens_the_engine_at_server_start(config, monkeypatch):
    opened = []
    real = mcp_server.get_engine
    monkeypatch.setattr(mcp_server, "get_engine", lambda cfg: opened.append(cfg) or real(cfg))

    async def recall(url):
        async with httpx.AsyncClient(timeout=60) as http, streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("recall_memories", {"query": "anything"})

    with background(mcp_app(ServeSettings(), config)) as base:
        assert opened == [config]  # before any client connected
        assert not anyio.run(recall, base + "/mcp").isError


INSPECTOR = Path(__file__).resolve().parents[1] / ".venv" / "node" / "node_modules" / ".bin" / "mcp-inspector"


@pytest.mark.skipif(not INSPECTOR.is_file(), reason="the MCP Inspector is not installed (scripts/setup.sh installs it with npm)")
def test_mcp_inspector_cli_lists_the_tools(tmp_path):
    """The official MCP Inspector (npm @modelcontextprotocol/inspector) in CLI mode against `tinycontext mcp`."""
    (tmp_path / "config.json").write_text(json.dumps({"memory_db_path": str(tmp_path / "m.db"), "models_dir": str(tmp_path / "models")}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}, "TINYCONTEXT_CONFIG_PATH": str(tmp_path / "config.json")}
    base = [str(INSPECTOR), "--cli", sys.executable, "-m", "tinycontext.cli.commands", "mcp"]
    listed = subprocess.run([*base, "--method", "tools/list"], capture_output=True, text=True, env=env, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    tools = {t["name"]: t for t in json.loads(listed.stdout)["tools"]}
    assert {"save_memories", "recall_memories", "list_memories", "list_sessions", "delete_memories"} <= set(tools)
    assert all("outputSchema" in t for t in tools.values())
    resources = subprocess.run([*base, "--method", "resources/list"], capture_output=True, text=True, env=env, timeout=300)
    assert resources.returncode == 0, resources.stderr[-2000:]
    assert {r["uri"] for r in json.loads(resources.stdout)["resources"]} == {"tinycontext://sessions", "tinycontext://stats"}

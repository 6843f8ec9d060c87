"""MCP over Streamable HTTP: the SDK's own client against uvicorn on loopback, with the real model."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tinycontext import TinyContextConfig, close_engines
from tinycontext.errors import ConfigError
from tinycontext.servers.http import ServeSettings, background, mcp_app

TOKEN = "t" * 16 + "-mcp-http-test-token"
TOOLS = {"save_memories", "recall_memories", "update_memory", "delete_memory", "get_memory"}


@pytest.fixture
def mcp_config(tmp_path):
    yield TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models", tools="memory,manage")
    close_engines()


async def _session_calls(url: str, headers: dict | None, calls):
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await calls(session)


def test_same_tools_as_stdio_and_real_recall_over_http(mcp_config):
    """Real model end to end: save in two sessions, recall within one, errors carry their code."""

    async def calls(session: ClientSession):
        tools = {t.name for t in (await session.list_tools()).tools}
        work = await session.call_tool("save_memories", {"session_id": "work", "memories": [
            {"content": "The deploy pipeline runs on GitHub Actions and ships to Fly.io", "tags": ["infra"]},
            {"content": "Code review needs two approvals before merging"}]})
        home = await session.call_tool("save_memories", {"session_id": "home", "memories": [
            {"content": "The cat is called Miso and eats at seven"}]})
        recall = await session.call_tool("recall_memories", {"query": "where do we deploy?", "session_id": "work", "top_k": 5, "detail": "full"})
        isolated = await session.call_tool("recall_memories", {"query": "what is the cat called", "session_id": "work", "detail": "full"})
        missing = await session.call_tool("get_memory", {"id": 999_999})
        budget = await session.call_tool("recall_memories", {"query": "cat", "max_tokens": 0})
        return tools, work, home, recall, isolated, missing, budget

    with background(mcp_app(ServeSettings(), mcp_config)) as base:
        tools, work, home, recall, isolated, missing, budget = anyio.run(_session_calls, base + "/mcp", None, calls)
    assert TOOLS <= tools
    assert not work.isError and len(work.structuredContent["ids"]) == 2
    first = recall.structuredContent["memories"][0]
    assert "Fly.io" in first["content"] and first["session_id"] == "work"
    home_id = home.structuredContent["ids"][0]
    assert home_id not in {m["id"] for m in isolated.structuredContent["memories"]}
    # Nothing in "work" is about a cat: the relevance floor may leave the answer empty, never another session's.
    assert {m["session_id"] for m in isolated.structuredContent["memories"]} <= {"work"}
    assert missing.isError and missing.content[0].text.startswith("memory_not_found: ") and missing.structuredContent is None
    assert budget.isError and budget.content[0].text.startswith("recall_budget: ") and budget.structuredContent is None


def test_a_client_closing_its_session_logs_no_error(mcp_config, caplog):
    """An SDK client ends its session with DELETE; the SDK's server then logged a ClosedResourceError
    traceback from the session's SSE writer for every client (79 in one bench_serve run). Filtered: it
    is the normal end of a session."""

    async def calls(session: ClientSession):
        return await session.call_tool("recall_memories", {"query": "anything"})

    with caplog.at_level(logging.DEBUG, logger="mcp.server.streamable_http"):
        with background(mcp_app(ServeSettings(), mcp_config)) as base:
            for _ in range(3):
                assert not anyio.run(_session_calls, base + "/mcp", None, calls).isError
    assert sum("Terminating session" in r.getMessage() for r in caplog.records) == 3  # the sessions did end by DELETE
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_token_required_on_mcp_endpoint(mcp_config):
    settings = ServeSettings(token=TOKEN)
    with background(mcp_app(settings, mcp_config)) as base:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        headers = {"accept": "application/json, text/event-stream"}
        for auth in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer " + TOKEN[:-1] + "X"},
                     {"authorization": TOKEN}):
            response = httpx.post(base + "/mcp", json=init, headers={**headers, **auth})
            assert response.status_code == 401 and response.json()["code"] == "unauthorized"
            assert TOKEN not in response.text

        async def list_tools(session):
            return {t.name for t in (await session.list_tools()).tools}

        assert TOOLS <= anyio.run(_session_calls, base + "/mcp", {"Authorization": f"Bearer {TOKEN}"}, list_tools)


def test_settings_from_env_and_bind_refusal():
    settings = ServeSettings.from_env({"MCP_HOST": "0.0.0.0", "MCP_PORT": "9001", "MCP_TRANSPORT": "SSE",
                                       "MCP_CORS_ORIGINS": "http://a.test, http://b.test"})
    assert (settings.host, settings.port, settings.transport, settings.cors_origins) == \
        ("0.0.0.0", 9001, "sse", ("http://a.test", "http://b.test"))
    with pytest.raises(ConfigError, match="TINYCONTEXT_API_TOKEN"):
        settings.check_bind()
    ServeSettings.from_env({"MCP_HOST": "0.0.0.0", "TINYCONTEXT_API_TOKEN": TOKEN}).check_bind()
    ServeSettings.from_env({"MCP_HOST": "::1"}).check_bind()
    assert repr(ServeSettings(token=TOKEN)).count(TOKEN) == 0
    for bad in ({"TINYCONTEXT_API_TOKEN": "short"}, {"MCP_TRANSPORT": "carrier-pigeon"}, {"MCP_PORT": "http"}):
        with pytest.raises(ConfigError):
            ServeSettings.from_env(bad)


def test_cli_serve_refuses_open_bind_without_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TINYCONTEXT_API_TOKEN"}
    env.update(MCP_HOST="0.0.0.0", TINYCONTEXT_MEMORY_DB_PATH=str(tmp_path / "x.db"))
    for extra in ([], ["--rest"]):
        done = subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", "serve", *extra], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and done.stderr.startswith("config_error: Refusing to listen on 0.0.0.0")
    assert not (tmp_path / "x.db").exists()

"""The stdio MCP server, driven by the SDK's real client over a real subprocess (`tinycontext mcp`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.fastmcp.exceptions import ToolError

from tinycontext import TinyContextConfig
from tinycontext.servers.mcp_server import build_server

SERVER = [sys.executable, "-m", "tinycontext.cli.commands", "mcp"]
TOOLS = {"save_memories", "recall_memories", "update_memory", "delete_memory", "get_memory", "list_memories", "list_sessions",
         "delete_memories"}
LINE = re.compile(r"^- (?P<content>.+) \((?P<date>\d{4}-\d{2}-\d{2})(?P<rest>.*); id (?P<id>\d+)\)$")


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # An explicit empty config file keeps a developer's own per-user config out of the test.
    (tmp_path / "config.json").write_text("{}")
    return {"TINYCONTEXT_CONFIG_PATH": str(tmp_path / "config.json"), "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "memory.db"),
            "TINYCONTEXT_MODELS_DIR": str(tmp_path / "models"), **extra}


def run_session(env: dict[str, str], scenario) -> None:
    async def main():
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=env)
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await scenario(session)

    anyio.run(main)


def text(result) -> str:
    assert len(result.content) == 1
    return result.content[0].text


def test_tools_over_stdio(tmp_path):
    async def scenario(session: ClientSession):
        # -- the tool list tells an agent when and how to use each tool
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == TOOLS  # the memory and manage capabilities; web and browser test their own tools
        assert "before answering" in tools["recall_memories"].description
        assert "self-contained fact" in tools["save_memories"].description
        assert tools["recall_memories"].annotations.readOnlyHint is True
        assert tools["delete_memory"].annotations.destructiveHint is True
        save_schema = tools["save_memories"].inputSchema
        assert save_schema["required"] == ["memories"]
        assert save_schema["properties"]["memories"]["items"]["required"] == ["content"]
        recall_schema = tools["recall_memories"].inputSchema
        assert recall_schema["required"] == ["query"]
        assert {"session_id", "max_tokens", "top_k", "tags", "offset", "detail"} <= set(recall_schema["properties"])

        # -- save: compact answer plus the full result as structured content
        facts = [
            {"content": "The user prefers pnpm as the JavaScript package manager.", "tags": ["prefs", "js"]},
            {"content": "Production deploys go to Fly.io from the main branch.", "tags": ["deploy"], "metadata": {"source": "standup"}},
            {"content": "The team decided to use PostgreSQL 16 for the billing service."},
        ]
        saved = await session.call_tool("save_memories", {"memories": facts, "session_id": "proj"})
        assert not saved.isError, text(saved)
        ids = saved.structuredContent["ids"]
        assert len(ids) == 3 and saved.structuredContent["session_id"] == "proj"
        assert text(saved) == f"Saved 3 in session proj: ids {', '.join(map(str, ids))}."
        pnpm, fly, postgres = ids

        again = await session.call_tool("save_memories", {"memories": facts[:1], "session_id": "proj"})
        assert again.structuredContent["ids"] == [] and f"duplicate of id {pnpm}" in text(again)

        # -- recall: one line per memory (content, date, tags, id)
        recalled = await session.call_tool("recall_memories", {"query": "Which package manager does the user prefer?", "session_id": "proj"})
        assert not recalled.isError, text(recalled)
        lines = text(recalled).splitlines()
        first = LINE.match(lines[0])
        assert first, lines[0]
        assert first["content"] == facts[0]["content"] and int(first["id"]) == pnpm and "tags: prefs, js" in first["rest"]
        structured = recalled.structuredContent
        assert len(lines) == len(structured["memories"]) >= 1  # the others fall under the relevance floor
        assert structured["memories"][0]["content"] == facts[0]["content"] and structured["memories"][0]["tags"] == ["prefs", "js"]

        # -- paging and budget footers
        every = "deploys Fly.io PostgreSQL billing pnpm"  # each fact matches a word of it
        paged = await session.call_tool("recall_memories", {"query": every, "top_k": 1})
        assert paged.structuredContent["next_offset"] == 1 and text(paged).endswith("call again with offset=1.)")
        page2 = await session.call_tool("recall_memories", {"query": every, "top_k": 1, "offset": 1})
        assert page2.structuredContent["memories"][0]["id"] != paged.structuredContent["memories"][0]["id"]
        tight = await session.call_tool("recall_memories", {"query": "PostgreSQL billing pnpm deploys", "max_tokens": 70})
        assert tight.structuredContent["truncated"] and len(tight.structuredContent["memories"]) == 1 and "offset=1" in text(tight)

        # -- update keeps history; get shows it
        updated = await session.call_tool("update_memory", {"id": postgres, "content": "The billing service uses PostgreSQL 17.", "tags": ["db"]})
        assert not updated.isError, text(updated)
        assert "PostgreSQL 17" in text(updated) and updated.structuredContent["version"] == 2
        got = await session.call_tool("get_memory", {"id": postgres})
        history = got.structuredContent["history"]
        assert [h["content"] for h in history] == [facts[2]["content"]]
        assert "v1 until" in text(got) and got.structuredContent["tags"] == ["db"]

        # -- delete, then the id is gone
        deleted = await session.call_tool("delete_memory", {"id": fly})
        assert not deleted.isError and text(deleted) == f"Deleted id {fly}."
        gone = await session.call_tool("get_memory", {"id": fly})
        assert gone.isError and text(gone).startswith("memory_not_found: ")
        assert gone.structuredContent is None  # an error carries no content the success outputSchema would refuse

        # -- errors are tool results whose text starts with the code
        empty = await session.call_tool("save_memories", {"memories": [{"content": "  "}]})
        assert empty.isError and text(empty).startswith("empty_memory: ")
        malformed = await session.call_tool("save_memories", {"memories": [{"tags": ["x"]}]})
        assert malformed.isError and text(malformed).startswith("invalid_input: ") and "content" in text(malformed)
        budget = await session.call_tool("recall_memories", {"query": "pnpm", "max_tokens": 0})
        assert budget.isError and text(budget).startswith("recall_budget: ")
        missing = await session.call_tool("recall_memories", {"query": "pnpm", "session_id": "nope"})
        assert missing.isError and text(missing).startswith("session_not_found: ")

        # -- hostile query text is just text
        for query in ['"; DROP TABLE memories; --', 'NEAR(pnpm OR * AND "', "pnpm\u202e\u0000", "\U0001F4A5" * 50]:
            result = await session.call_tool("recall_memories", {"query": query})
            assert not result.isError or text(result).startswith("invalid_input: "), text(result)
        still = await session.call_tool("recall_memories", {"query": "pnpm package manager"})
        assert still.structuredContent["memories"][0]["id"] == pnpm

    run_session(server_env(tmp_path, TINYCONTEXT_TOOLS="memory,manage"), scenario)


def test_model_failure_is_a_tool_error(tmp_path):
    """The server starts even if the model cannot load; every tool call then says why."""
    missing = tmp_path / "no-such-model"

    async def scenario(session: ClientSession):
        result = await session.call_tool("recall_memories", {"query": "anything"})
        assert result.isError
        assert text(result).startswith("model_unavailable: ") and str(missing) in text(result)

    run_session(server_env(tmp_path, TINYCONTEXT_EMBEDDING_MODEL=str(missing)), scenario)


INITIALIZE = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def call(request_id: int, tool: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


def exchange(command: list[str], env: dict[str, str], requests: list[dict]) -> tuple[dict, bytes, bytes]:
    """Raw JSON-RPC over pipes, one request at a time as a client would (EOF cancels unanswered ones).

    Returns the answers by id, whatever else reached stdout, and stderr; the server must exit 0 on EOF.
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**base, **env})
    watchdog = threading.Timer(120, proc.kill)  # a hung server fails the test instead of blocking it
    watchdog.start()
    try:
        lines: list[bytes] = []
        for request in requests:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
            if "id" in request:
                lines.append(proc.stdout.readline())
        rest, err = proc.communicate(timeout=60)  # closes stdin
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    messages = [json.loads(line) for line in lines]
    assert all(m["jsonrpc"] == "2.0" for m in messages)
    return {m["id"]: m["result"] for m in messages}, rest, err


def test_stdout_carries_only_protocol(tmp_path):
    memories = [{"content": f"Fact number {i} about the project."} for i in range(40)]  # several embedding batches
    answers, rest, err = exchange(SERVER, server_env(tmp_path), [
        *INITIALIZE, call(2, "save_memories", {"memories": memories}), call(3, "recall_memories", {"query": "fact 7"})])
    assert rest == b"", "nothing but answers may reach stdout"
    assert answers[1]["serverInfo"]["name"] == "tinycontext"
    assert len(answers[2]["structuredContent"]["ids"]) == 40
    assert answers[3]["structuredContent"]["memories"]
    assert b"Traceback" not in err


NOISY_SERVER = """
import os
from tinycontext.cli.commands import _serve_stdio
from tinycontext.servers.mcp_server import build_server

server = build_server()

@server.tool()
def noisy() -> str:
    print("stray print")
    os.write(1, b"native write\\n")
    return "done"

_serve_stdio(server)
"""


def test_stray_stdout_writes_go_to_stderr(tmp_path):
    """print() and raw writes to fd 1 inside the server cannot corrupt the protocol stream."""
    env = server_env(tmp_path, TINYCONTEXT_EMBEDDING_MODEL=str(tmp_path / "absent"))  # no model load needed
    answers, rest, err = exchange([sys.executable, "-c", NOISY_SERVER], env, [*INITIALIZE, call(2, "noisy", {})])
    assert answers[2]["content"][0]["text"] == "done"
    assert rest == b""
    assert b"stray print" in err and b"native write" in err


def test_unexpected_failures_carry_a_code(tmp_path):
    """In process: argument errors and bugs are tool errors starting with invalid_input / internal_error."""
    server = build_server(TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models", tools="all"))

    @server.tool()
    def boom() -> str:
        raise RuntimeError("kaput")

    async def main():
        with pytest.raises(ToolError, match=r"^internal_error: RuntimeError: kaput$"):
            await server.call_tool("boom", {})
        wrong = await server.call_tool("get_memory", {"id": "not a number"})
        assert wrong.isError and wrong.content[0].text.startswith("invalid_input: get_memory: id: ")
        with pytest.raises(ToolError, match=r"^invalid_input: Unknown tool: no_such_tool\. This server lists save_memories, "):
            await server.call_tool("no_such_tool", {})

    anyio.run(main)

"""The MCP surface a client can introspect: capability profiles, compact schemas measured through a real
client, every option of every tool called (so a shorter description lost no capability), arguments as
strict as REST, errors that the Python and the TypeScript SDK (the MCP Inspector's) both read, resources,
instructions, and the engine opened at server start over HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import jsonschema
import pytest
from fastapi.testclient import TestClient
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.memory import create_connected_server_and_client_session

from tinycontext import ConfigError, TinyContextConfig, close_engines, load_config
from tinycontext.servers import mcp_server, tools
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background, mcp_app
from tinycontext.servers.mcp_server import build_server

REPO = Path(__file__).resolve().parents[1]
METER = REPO.parent / "shared" / "tools" / "mcp_schema_tokens.py"
# setup.sh installs the Inspector under the venv (.venv/node); a worktree borrows another checkout's venv.
NODE_MODULES = next((p for p in (Path(sys.prefix) / "node" / "node_modules", REPO / ".venv" / "node" / "node_modules")
                     if (p / ".bin" / "mcp-inspector").is_file()), None)
needs_inspector = pytest.mark.skipif(NODE_MODULES is None, reason="the MCP Inspector is not installed (scripts/setup.sh installs it with npm)")
BROWSER_TOOLS = {"browser_navigate", "browser_act"}


@pytest.fixture
def config(tmp_path):
    # The web tools answer without a packet leaving the machine: SearXNG unconfigured, a refused address.
    yield TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models", tools="all",
                            search_backend="searxng", searxng_url="")
    close_engines()


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"memory_db_path": str(tmp_path / "m.db"), "models_dir": str(tmp_path / "models"),
                                                      "search_backend": "searxng", "searxng_url": ""}))
    base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    return {**base, "PYTHONPATH": str(REPO), "TINYCONTEXT_CONFIG_PATH": str(tmp_path / "config.json"), **extra}


# -- profiles -------------------------------------------------------------------------------------

def names(config: TinyContextConfig) -> list[str]:
    return [t.name for t in anyio.run(build_server(config).list_tools)]


def test_the_tools_setting_picks_the_capabilities(tmp_path):
    base = TinyContextConfig(memory_db_path=tmp_path / "m.db")
    assert base.tools == ("memory",) and names(base) == ["save_memories", "recall_memories"]
    manage = names(base.model_copy(update={"tools": ("memory", "manage")}))
    assert manage == ["save_memories", "recall_memories", "get_memory", "update_memory", "delete_memory", "list_memories",
                      "list_sessions", "delete_memories"]
    assert names(base.model_copy(update={"tools": ("web",)})) == ["search", "scrape_urls", "current_datetime"]
    every = names(TinyContextConfig(memory_db_path=tmp_path / "m.db", tools="all"))
    assert every == [spec.name for spec in tools.specs(base)] and len(every) == 13
    # The env form is comma-separated; "all" is every capability; a kill switch still wins.
    assert load_config(env={"TINYCONTEXT_TOOLS": "memory, browser"}).tools == ("memory", "browser")
    assert load_config(env={"TINYCONTEXT_TOOLS": "all"}).tools == ("memory", "manage", "web", "browser")
    assert load_config(env={"TINYCONTEXT_TOOLS": '["web"]'}).tools == ("web",)
    with pytest.raises(ConfigError, match="tools"):
        load_config(env={"TINYCONTEXT_TOOLS": "memory,admin"})
    assert "search" not in names(TinyContextConfig(memory_db_path=tmp_path / "m.db", tools="all", web_tools=False))
    assert not BROWSER_TOOLS & set(names(TinyContextConfig(memory_db_path=tmp_path / "m.db", tools="all", browser_backend="off")))


def test_instructions_and_hints_name_only_listed_tools(tmp_path):
    lean = build_server(TinyContextConfig(memory_db_path=tmp_path / "m.db"))._mcp_server.instructions
    full = build_server(TinyContextConfig(memory_db_path=tmp_path / "m.db", tools="all"))._mcp_server.instructions
    assert "recall_memories" in lean and "update_memory" not in lean and "scrape_urls" not in lean
    assert "update_memory" in full and "delete_memories" in full and "scrape_urls" in full
    near = {"session_id": "s", "ids": [2], "skipped": [], "near_duplicates": [{"index": 0, "similar_to": 1, "similarity": 0.97}]}
    assert "update_memory" not in mcp_server.render_save(near, can_update=False)
    assert "update_memory it instead" in mcp_server.render_save(near, can_update=True)


# -- schema size through a real client ------------------------------------------------------------

def meter(tmp_path: Path, limit: int, profile: str) -> tuple[dict[str, int], int, int]:
    """../shared/tools/mcp_schema_tokens.py (the issue's measure) against `tinycontext mcp` with ``profile``."""
    env = server_env(tmp_path, TINYCONTEXT_TOOLS=profile, TIKTOKEN_CACHE_DIR=str(REPO.parent / "shared" / "tiktoken" / "cache"))
    # The meter passes on only TINYCONTEXT_*, TIKTOKEN_*, HF_*, PATH and HOME: env(1) carries PYTHONPATH to the server.
    run = subprocess.run([sys.executable, str(METER), str(limit), "env", f"PYTHONPATH={REPO}", sys.executable, "-m", "tinycontext", "mcp"],
                         capture_output=True, text=True, env=env, timeout=300)
    per_tool = {m[1]: int(m[2]) for m in re.finditer(r"^\s+(\w+)\s+(\d+)$", run.stdout, re.M)}
    total = int(re.search(r"schema (\d+) tokens", run.stdout)[1])
    return per_tool, total, run.returncode


def test_schemas_meet_their_token_targets_through_a_real_client(tmp_path):
    default, default_total, ok = meter(tmp_path / "default", 1500, "memory")
    assert ok == 0 and default_total <= 1500 and list(default) == ["save_memories", "recall_memories"]
    assert default["save_memories"] + default["recall_memories"] <= 450
    every, total, ok = meter(tmp_path / "all", 3000, "all")
    assert ok == 0 and total <= 3000 and len(every) == 13
    assert max(every.values()) <= 300, every
    memory_tools = [s.name for s in tools.specs(TinyContextConfig()) if s.capability in ("memory", "manage")]
    assert sum(every[name] for name in memory_tools) <= 1000
    # What doctor and the harness report is what the client measured.
    assert tools.schema_tokens(tools.active(TinyContextConfig(tools="all", search_backend="searxng"))) == every


def test_hand_written_schemas_offer_every_argument_their_model_takes():
    for spec in tools.specs(TinyContextConfig()):
        assert set(spec.properties) == set(spec.request.model_fields), spec.name
        assert set(spec.required) == {n for n, f in spec.request.model_fields.items() if f.is_required()}, spec.name
        jsonschema.Draft202012Validator.check_schema(spec.input_schema)
        assert "$defs" not in json.dumps(spec.input_schema) and "title" not in spec.input_schema
    item = tools.specs(TinyContextConfig())[0].properties["memories"]["items"]
    # The conversation fields are documented on the item rather than given schemas of their own.
    named = set(item["properties"]) | set(re.findall(r"\b([a-z_]+)\b", item["description"]))
    assert set(tools.MemoryItem.model_fields) <= named


# -- every option, checked against outputSchema -------------------------------------------------

async def checked_call(client, listed: dict, used: dict[str, set[str]], name: str, arguments: dict):
    """The compact schema admits the call, the server accepts it, ClientSession checks the structured
    content against outputSchema, and so does jsonschema here; ``used`` collects the arguments given."""
    jsonschema.validate(arguments, listed[name].inputSchema)
    result = await client.call_tool(name, arguments)
    assert not result.isError, result.content[0].text
    jsonschema.validate(result.structuredContent, listed[name].outputSchema)
    used.setdefault(name, set()).update(arguments)
    return result

def test_every_option_of_every_tool_works_and_matches_its_output_schema(config):
    server = build_server(config)
    used: dict[str, set[str]] = {}

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            assert "recall_memories" in server._mcp_server.instructions
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert all(t.outputSchema for t in listed.values()), [n for n, t in listed.items() if not t.outputSchema]

            async def call(name, arguments):
                return (await checked_call(client, listed, used, name, arguments)).structuredContent

            saved = await call("save_memories", {"session_id": "proj", "episode": "standup-1", "memories": [
                {"content": "The API is written in Go", "tags": ["stack"], "metadata": {"source": "chat"}},
                {"content": "The API is written in Go"},
                {"content": "Releases ship on Thursdays", "ttl_seconds": 3600},
                {"content": "Ana: I moved the retro to Friday", "speaker": "Ana", "occurred_at": "2025-03-04T10:00",
                 "attachments": ["a photo of the team calendar"], "episode": "standup-2"},
                {"content": "The staging database is wiped monthly", "expires_at": "2999-01-01"}]})
            first = saved["ids"][0]
            assert len(saved["ids"]) == 4 and saved["skipped"][0]["reason"] == "duplicate"
            recalled = await call("recall_memories", {"query": "what language is the API in", "max_tokens": 500, "top_k": 3,
                                                      "session_id": "proj", "tags": ["stack"], "offset": 0, "detail": "full",
                                                      "filters": {"metadata": {"source": "chat"}, "created_at": {"gte": "2000-01-01"}},
                                                      "include_superseded": True})
            assert [m["id"] for m in recalled["memories"]] == [first] and recalled["memories"][0]["session_id"] == "proj"
            updated = await call("update_memory", {"id": first, "content": "The API is written in Rust", "tags": ["stack", "rust"],
                                                   "metadata": {"source": "review"}, "expected_version": 1})
            assert updated["version"] == 2 and updated["tags"] == ["stack", "rust"]
            got = await call("get_memory", {"id": first})
            assert got["history"][0]["content"] == "The API is written in Go"
            listed_page = await call("list_memories", {"session_id": "proj", "tags": ["rust"], "filters": {"tags_all": ["stack"]},
                                                       "order": "oldest", "offset": 0, "limit": 1, "max_tokens": 300, "detail": "full"})
            assert [m["id"] for m in listed_page["memories"]] == [first]
            assert (await call("list_sessions", {}))["sessions"][0]["session_id"] == "proj"
            dry = await call("delete_memories", {"session_id": "proj", "tags": ["rust"], "filters": {"metadata": {"source": "review"}},
                                                 "dry_run": True})
            assert dry["matched"] == 1 and dry["deleted"] == 0
            assert (await call("delete_memories", {"session_id": "proj", "tags": ["rust"], "dry_run": False, "confirm": 1}))["deleted"] == 1
            assert (await call("delete_memory", {"id": saved["ids"][1]}))["deleted"]
            found = await call("search", {"items": [{"query": "sqlite", "domains": ["sqlite.org"]}], "max_tokens": 200})
            assert found["searches"][0]["outcome"] == "unavailable"
            scraped = await call("scrape_urls", {"items": [{"url": "http://10.0.0.1/", "query": "anything"}], "max_tokens": 300,
                                                 "order": "rank", "backend": "http"})
            assert scraped["results"][0]["outcome"] == "blocked"
            await call("current_datetime", {})

            resources = {str(r.uri) for r in (await client.list_resources()).resources}
            assert resources == {"tinycontext://sessions", "tinycontext://stats"}
            sessions = json.loads((await client.read_resource("tinycontext://sessions")).contents[0].text)
            assert sessions["sessions"][0]["session_id"] == "proj" and sessions["sessions"][0]["memories"] == 2
            stats = json.loads((await client.read_resource("tinycontext://stats")).contents[0].text)
            assert stats["search_mode"] == "hybrid" and stats["schema_version"] >= 4 and stats["embedder"]["dimensions"] == 384

    anyio.run(scenario)
    # Every argument of every tool was used (the browser's have their own tests with a real Chromium).
    for spec in tools.active(config):
        if spec.name not in BROWSER_TOOLS:
            assert used.get(spec.name, set()) == set(spec.properties), spec.name


def browser_missing() -> str | None:
    try:
        import playwright  # noqa: F401

        from tinycontext.web.browser.launch import find_executable

        find_executable(TinyContextConfig())
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return None


@pytest.mark.skipif(browser_missing() is not None, reason="no browser (Chromium and Playwright)")
def test_every_browser_option_reaches_the_browser(tmp_path):
    """The browser tools through the MCP client with each of their arguments (real Chromium, a page on 127.0.0.1)."""
    import browser_pages
    from tinycontext.web.browser import close_services

    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", tools="browser",
                               allow_private_hosts=True)
    used: dict[str, set[str]] = {}

    async def scenario(site):
        async with create_connected_server_and_client_session(build_server(config)._mcp_server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}

            async def call(name, arguments):
                return await checked_call(client, listed, used, name, arguments)

            shallow = await call("browser_navigate", {"url": site.url("/big"), "depth": 1, "max_tokens": 2000})
            assert "inside)" in shallow.content[0].text
            found = await call("browser_navigate", {"url": site.url("/big"), "find": "Quantity|Checkout"})
            field = re.search(r'textbox "Quantity".* ref=(e\d+)', found.content[0].text)[1]
            typed = await call("browser_act", {"action": "type", "ref": field, "text": "3", "find": "Quantity|Checkout",
                                               "depth": 9, "max_tokens": 500})
            assert typed.structuredContent["tokens"] <= 500 and 'textbox "Quantity" = "3"' in typed.content[0].text

    try:
        with browser_pages.server() as site:
            anyio.run(scenario, site)
    finally:
        close_services()
    for spec in tools.active(config):
        assert used[spec.name] == set(spec.properties), spec.name


# -- one argument contract for MCP and REST ---------------------------------------------------------

BAD_ARGUMENTS = [  # (tool, arguments, the argument the error names)
    ("recall_memories", {"query": "x", "max_tokens": "100"}, "max_tokens"),
    ("recall_memories", {"query": "x", "top_k": 2.0}, "top_k"),
    ("recall_memories", {"query": "x", "tags": "stack"}, "tags"),
    ("recall_memories", {"query": "x", "detail": "everything"}, "detail"),
    ("recall_memories", {"query": "x", "filters": {"tags_any": "stack"}}, "filters.tags_any"),
    ("recall_memories", {"query": "x", "filters": {"since": "2020"}}, "filters.since"),
    ("recall_memories", {"query": "x", "limit": 5}, "limit"),
    ("recall_memories", {}, "query"),
    ("save_memories", {"memories": [{"content": "x", "ttl_seconds": "5"}]}, "memories.0.ttl_seconds"),
    ("save_memories", {"memories": [{"content": "x", "tags": [1]}]}, "memories.0.tags.0"),
    ("save_memories", {"memories": [{"tags": ["x"]}]}, "memories.0.content"),
    ("save_memories", {"memories": "a fact"}, "memories"),
    ("get_memory", {"id": True}, "id"),
    ("get_memory", {"id": "5"}, "id"),
    ("delete_memory", {"id": 5.0}, "id"),
    ("update_memory", {"id": 1, "expected_version": "1"}, "expected_version"),
    ("list_memories", {"limit": "10"}, "limit"),
    ("list_memories", {"order": "random"}, "order"),
    ("delete_memories", {"session_id": "p", "dry_run": "false"}, "dry_run"),
    ("delete_memories", {"session_id": "p", "confirm": True}, "confirm"),
    ("search", {"items": [{"query": "x", "site": "a.org"}]}, "items.0.site"),
    ("scrape_urls", {"items": [{"url": "http://127.0.0.1/"}], "order": "best"}, "order"),
    ("scrape_urls", {"items": [{"url": "http://127.0.0.1/"}], "max_tokens": "300"}, "max_tokens"),
    ("browser_navigate", {"url": "http://127.0.0.1/", "depth": "2"}, "depth"),
    ("browser_act", {"action": "fly"}, "action"),
]
REST_PATHS = {"recall_memories": "/recall_memories", "save_memories": "/save_memories", "get_memory": "/get_memory",
              "delete_memory": "/delete_memory", "update_memory": "/update_memory", "list_memories": "/list_memories",
              "delete_memories": "/delete_memories", "search": "/search", "scrape_urls": "/scrape_urls",
              "browser_navigate": "/browser/navigate", "browser_act": "/browser/act"}


def test_arguments_are_as_strict_over_mcp_as_over_rest(config):
    server = build_server(config)
    rest = TestClient(create_app(config, settings=ServeSettings()), base_url="http://127.0.0.1")

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            for name, arguments, where in BAD_ARGUMENTS:
                result = await client.call_tool(name, arguments)
                text = result.content[0].text
                assert result.isError and result.structuredContent is None, (name, arguments, text)
                assert text.startswith(f"invalid_input: {name}: {where}: "), (name, arguments, text)
                assert "Fix the arguments and call again; it takes " in text
                response = rest.post(REST_PATHS[name], json=arguments)
                assert response.status_code == 422 and response.json()["code"] == "invalid_input", (name, response.text)
                assert where.split(".")[0] in response.json()["message"]

    anyio.run(scenario)


# -- errors every client reads -------------------------------------------------------------------

def error_calls() -> list[tuple[str, dict, str]]:
    """(tool, arguments, expected code): each error code of each tool that a server with no memories yet gives.
    Memory id 1 exists (saved first); the browser's own errors need Chromium (tests/test_browser.py)."""
    return [
        ("save_memories", {"memories": [{"content": "Deploys go to Fly.io"}]}, ""),
        ("save_memories", {"memories": [{"content": "  "}]}, "empty_memory"),
        ("save_memories", {"memories": []}, "empty_memory"),
        ("save_memories", {"memories": [{"content": "x", "ttl_seconds": "5"}]}, "invalid_input"),
        ("recall_memories", {"query": "deploys", "max_tokens": 0}, "recall_budget"),
        ("recall_memories", {"query": "deploys", "session_id": "nope"}, "session_not_found"),
        ("recall_memories", {"query": "deploys", "max_tokens": "100"}, "invalid_input"),
        ("get_memory", {"id": 999}, "memory_not_found"),
        ("get_memory", {"id": True}, "invalid_input"),
        ("update_memory", {"id": 999, "content": "x"}, "memory_not_found"),
        ("update_memory", {"id": 1, "content": "Deploys go to Render", "expected_version": 7}, "conflict"),
        ("update_memory", {"id": 1, "content": " "}, "empty_memory"),
        ("update_memory", {"id": "1"}, "invalid_input"),
        ("delete_memory", {"id": 999}, "memory_not_found"),
        ("delete_memory", {}, "invalid_input"),
        ("list_memories", {"session_id": "nope"}, "session_not_found"),
        ("list_memories", {"max_tokens": 1}, "recall_budget"),
        ("list_memories", {"limit": 0}, "invalid_input"),
        ("list_sessions", {"verbose": True}, "invalid_input"),
        ("delete_memories", {}, "invalid_input"),
        ("delete_memories", {"session_id": "default", "dry_run": False}, "invalid_input"),
        ("delete_memories", {"session_id": "nope"}, "session_not_found"),
        ("search", {"items": []}, "invalid_input"),
        ("search", {"items": [{"query": "x"}], "max_tokens": 1}, "recall_budget"),
        ("scrape_urls", {"items": []}, "invalid_input"),
        ("scrape_urls", {"items": [{"url": "http://127.0.0.1/"}], "max_tokens": 1}, "recall_budget"),
        ("current_datetime", {"tz": "UTC"}, "invalid_input"),
        ("browser_navigate", {"url": "http://127.0.0.1/", "max_tokens": 1}, "invalid_input"),
        ("browser_act", {"action": "click", "extra": 1}, "invalid_input"),
        ("no_such_tool", {}, "invalid_input"),
    ]


def check_errors(results: list[dict]) -> None:
    for (name, arguments, code), got in zip(error_calls(), results):
        assert "thrown" not in got, (name, arguments, got)  # the client itself refused the answer
        result = got["result"]
        text = result["content"][0]["text"]
        if not code:
            assert not result.get("isError"), text
            continue
        assert result["isError"] is True and "structuredContent" not in result, (name, arguments, result)
        assert re.match(rf"{code}: \S", text), (name, arguments, text)


def test_errors_reach_the_python_client(config):
    server = build_server(config)

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            await client.list_tools()  # the client then checks each result against its tool's outputSchema
            return [{"result": (await client.call_tool(name, arguments)).model_dump(exclude_none=True)}
                    for name, arguments, _ in error_calls()]

    check_errors(anyio.run(scenario))


@needs_inspector
def test_errors_reach_the_typescript_client(tmp_path):
    """The TypeScript SDK's client (the one the MCP Inspector ships) refuses any structured content that does not
    match the outputSchema, errors included: every error must still arrive as the server's own message."""
    env = server_env(tmp_path, TINYCONTEXT_TOOLS="all")
    job = {"sdk": str(NODE_MODULES / "@modelcontextprotocol" / "sdk"), "command": sys.executable, "args": ["-m", "tinycontext", "mcp"],
           "env": env, "calls": [{"name": n, "arguments": a} for n, a, _ in error_calls()]}
    run = subprocess.run(["node", str(REPO / "tests" / "mcp_ts_client.mjs")], input=json.dumps(job), capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    check_errors(json.loads(run.stdout))


@needs_inspector
def test_mcp_inspector_cli_shows_the_servers_messages(tmp_path):
    """The official MCP Inspector (npm @modelcontextprotocol/inspector) in CLI mode against `tinycontext mcp`."""
    env = server_env(tmp_path, TINYCONTEXT_TOOLS="memory,manage")
    base = [str(NODE_MODULES / ".bin" / "mcp-inspector"), "--cli", sys.executable, "-m", "tinycontext", "mcp"]

    def inspector(*args: str) -> dict:
        done = subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
        return json.loads(done.stdout)

    listed = inspector("--method", "tools/list")["tools"]
    assert [t["name"] for t in listed][:2] == ["save_memories", "recall_memories"] and all("outputSchema" in t for t in listed)
    resources = inspector("--method", "resources/list")["resources"]
    assert {r["uri"] for r in resources} == {"tinycontext://sessions", "tinycontext://stats"}
    # The Inspector converts --tool-arg values by the schema's type (a non-number becomes null).
    for args, code in ((["--tool-name", "get_memory", "--tool-arg", "id=42"], "memory_not_found"),
                       (["--tool-name", "get_memory", "--tool-arg", "id=forty-two"], "invalid_input"),
                       (["--tool-name", "recall_memories", "--tool-arg", "query=x", "--tool-arg", "session_id=nope"], "session_not_found"),
                       (["--tool-name", "save_memories", "--tool-arg", "memories=[]"], "empty_memory")):
        shown = inspector("--method", "tools/call", *args)
        assert shown["isError"] is True and "structuredContent" not in shown
        assert shown["content"][0]["text"].startswith(f"{code}: "), shown


# -- HTTP --------------------------------------------------------------------------------------------

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

"""Management views (management=on): the manifest and views as MCP resources over stdio and Streamable HTTP
(the SDK's real client), the same views over REST (httpx), the access rules with their refusals, and the
refusal to serve management over HTTP without access control."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from pydantic import ValidationError

from tinycontext import TinyContextConfig, close_engines
from tinycontext.activity import Event, close_activity, open_activity
from tinycontext.config import load_config
from tinycontext.errors import ConfigError
from tinycontext.servers.http import ServeSettings, background, mcp_app, rest_app
from tinycontext.servers.manage import VIEWS
from tinycontext.servers.tools import schema_tokens

from netguard import loopback_only  # noqa: F401  (fixture)
from test_activity import run_stdio, server_env
from test_web_tools import site, web_config  # noqa: F401  (fixture)

MANAGEMENT_TOKEN = "m" * 20 + "-management-token"
PROXY_TOKEN = "p" * 28 + "-proxy-token-for-tests"
API_TOKEN = "a" * 20 + "-api-token-for-tests"
INSTANCE = {v.uri for v in VIEWS if v.scope == "instance"}
PER_CALLER = {v.uri for v in VIEWS if v.scope == "caller"}


@pytest.fixture(autouse=True)
def _closed():
    yield
    close_activity()
    close_engines()


def managed(tmp_path, **more) -> TinyContextConfig:
    values = dict(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend="none",
                  activity="history", activity_db=tmp_path / "act" / "activity.db", management=True,
                  management_token=MANAGEMENT_TOKEN, management_trusted_proxies="127.0.0.1/32",
                  management_proxy_token=PROXY_TOKEN)
    return TinyContextConfig(**{**values, **more})


def as_user(name: str, proxy_token: str = PROXY_TOKEN) -> dict:
    return {"X-Forwarded-User": name, "X-TinyContext-Proxy-Token": proxy_token}


def test_stdio_client_is_the_operator(tmp_path):
    env = server_env(tmp_path, TINYCONTEXT_ACTIVITY="history", TINYCONTEXT_MANAGEMENT="on")

    async def scenario(session: ClientSession):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        resources = {str(r.uri) for r in (await session.list_resources()).resources}
        await session.call_tool("save_memories", {"memories": [{"content": "Lunch is at noon."}]})
        await session.call_tool("recall_memories", {"query": "lunch"})
        manifest = (await session.read_resource("tinycontext://manage/manifest")).contents[0].text
        views = {}
        for uri in INSTANCE | PER_CALLER:
            views[uri] = (await session.read_resource(uri)).contents[0].text
        cleared = await session.call_tool("clear_my_history", {})
        after = (await session.read_resource("tinycontext://manage/my/memory")).contents[0].text
        return tools, resources, manifest, views, cleared, after

    import json

    tools, resources, manifest, views, cleared, after = run_stdio(env, scenario)
    assert "clear_my_history" in tools and tools["clear_my_history"].annotations.destructiveHint is True
    assert {"tinycontext://manage/manifest"} | INSTANCE | PER_CALLER <= resources
    manifest = json.loads(manifest)
    assert manifest["you"]["operator"] and manifest["you"]["identified"]
    assert {v["uri"] for v in manifest["views"]} == INSTANCE | PER_CALLER and all(v["readable"] for v in manifest["views"])
    assert manifest["tools"] == ["clear_my_history"]
    health = json.loads(views["tinycontext://manage/health"])
    assert health["memory"]["memories"] == 1
    assert health["activity"]["by_operation"] == {"save_memories": {"ok": 1}, "recall_memories": {"ok": 1}}
    rules = json.loads(views["tinycontext://manage/rules"])
    assert "loopback" in rules["ssrf"]["refused"] and "127.0.0.0/8" in rules["ssrf"]["not_global_networks"]
    mine = json.loads(views["tinycontext://manage/my/memory"])
    assert [e["operation"] for e in mine["events"]] == ["recall_memories", "save_memories"]
    assert json.loads(views["tinycontext://manage/my/searches"])["events"] == []
    assert cleared.structuredContent == {"deleted": 2}
    assert json.loads(after)["events"] == []


def test_management_off_adds_no_tool_and_no_resource(tmp_path):
    env = server_env(tmp_path, TINYCONTEXT_ACTIVITY="history")

    async def scenario(session: ClientSession):
        return ({t.name for t in (await session.list_tools()).tools},
                {str(r.uri) for r in (await session.list_resources()).resources})

    tools, resources = run_stdio(env, scenario)
    assert "clear_my_history" not in tools and not any(r.startswith("tinycontext://manage/") for r in resources)


def test_the_clear_tool_is_small():
    from tinycontext.servers.manage import CLEAR_TOOL

    # It rides on every request when management is on: a name, a line and an empty schema.
    assert CLEAR_TOOL.input_schema == {"type": "object", "properties": {}}
    assert schema_tokens([CLEAR_TOOL])["clear_my_history"] < 50


async def _read(url: str, headers: dict, uris: list[str], calls: list[str] = ()) -> dict:
    out: dict = {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for name in calls:
                    out[name] = await session.call_tool(name, {"query": "anything"} if name == "recall_memories" else {})
                for uri in uris:
                    try:
                        out[uri] = (await session.read_resource(uri)).contents[0].text
                    except McpError as err:
                        out[uri] = err
    return out


def test_access_rules_over_mcp_http(tmp_path):
    import json

    config = managed(tmp_path)
    views = ["tinycontext://manage/manifest", "tinycontext://manage/health", "tinycontext://manage/my/memory"]
    with background(mcp_app(ServeSettings(), config)) as base:
        nobody = anyio.run(_read, base + "/mcp", {}, views)
        wrong = anyio.run(_read, base + "/mcp", {"Authorization": "Bearer " + "x" * len(MANAGEMENT_TOKEN)}, views)
        operator = anyio.run(_read, base + "/mcp", {"Authorization": "Bearer " + MANAGEMENT_TOKEN}, views)
        no_proxy_token = anyio.run(_read, base + "/mcp", {"X-Forwarded-User": "alice"}, views)
        bad_proxy_token = anyio.run(_read, base + "/mcp", as_user("alice", "q" * len(PROXY_TOKEN)), views)
        alice = anyio.run(_read, base + "/mcp", as_user("alice"), views, ["recall_memories", "clear_my_history"])
        alice_after = anyio.run(_read, base + "/mcp", as_user("alice"), views[2:], ["recall_memories"])
        bob = anyio.run(_read, base + "/mcp", as_user("bob"), views[2:])

    for refused in (nobody, wrong, no_proxy_token, bad_proxy_token):
        assert isinstance(refused[views[1]], McpError) and "unauthorized" in str(refused[views[1]])
        assert isinstance(refused[views[2]], McpError) and "forbidden" in str(refused[views[2]])
        assert not json.loads(refused[views[0]])["you"]["identified"]  # the manifest itself is for anyone
    assert "missing or wrong X-TinyContext-Proxy-Token" in str(bad_proxy_token[views[2]])
    assert json.loads(operator[views[1]])["status"] == "ok"
    assert json.loads(operator[views[0]])["you"] == {"operator": True, "identified": False, "caller": None}
    assert isinstance(operator[views[2]], McpError)  # the operator token names nobody: no "my" views
    assert isinstance(alice[views[1]], McpError)  # an identity is not the operator
    assert alice["clear_my_history"].structuredContent == {"deleted": 1}  # her recall, before the clear
    mine = json.loads(alice_after[views[2]])
    assert [e["operation"] for e in mine["events"]] == ["recall_memories"] and mine["caller"]
    assert json.loads(bob[views[2]])["events"] == []  # one caller never sees another's records
    log = open_activity(config)
    assert log.summary()["callers"] == 1  # alice's one record left, stored under her salted hash
    raw = b"".join(open(f"{config.activity_db}{s}", "rb").read() for s in ("", "-wal") if os.path.exists(f"{config.activity_db}{s}"))
    assert b"alice" not in raw


def test_access_rules_over_rest(tmp_path, monkeypatch):
    config = managed(tmp_path, activity="content")
    log = open_activity(config)
    search = {"searches": [{"query": "q", "outcome": "ok", "results": [{"url": "https://docs.example.org/a"},
                                                                      {"url": "https://news.example.com/b"}]}]}
    scrape = {"results": [{"url": "https://docs.example.org/a", "outcome": "ok"}, {"url": "http://10.0.0.1/", "outcome": "blocked"}]}
    log.record(Event("search", "ok", 3, "rest", caller="user:carol", answer=search))
    log.record(Event("scrape_urls", "ok", 9, "rest", caller="user:carol", answer=scrape))
    operator = {"Authorization": "Bearer " + MANAGEMENT_TOKEN}
    with background(rest_app(ServeSettings(), config)) as base:
        get = lambda path, headers={}: httpx.get(base + path, headers=headers)  # noqa: E731
        assert get("/manage/health").status_code == 401 and get("/manage/health").json()["code"] == "unauthorized"
        assert get("/manage/health", {"Authorization": "Bearer short"}).status_code == 401
        assert get("/manage/health", {"Authorization": "Bearer " + MANAGEMENT_TOKEN[:-1] + "X"}).status_code == 401
        domains = get("/manage/domains", operator).json()["domains"]
        with monkeypatch.context() as patched:  # the rules view asks for its one number, not the whole summary
            patched.setattr(type(log), "summary", lambda self: pytest.fail("the rules view read the activity summary"))
            rules = get("/manage/rules", operator).json()
        assert get("/manage/my/pages").status_code == 403
        assert get("/manage/my/pages", {"X-Forwarded-User": "carol"}).status_code == 403
        pages = get("/manage/my/pages", as_user("carol")).json()
        searches = get("/manage/my/searches", as_user("carol")).json()
        cleared = httpx.post(base + "/manage/my/clear", headers=as_user("carol")).json()
        refused_clear = httpx.post(base + "/manage/my/clear", headers=operator)
    assert {"domain": "docs.example.org", "discovered": 1, "fetched": 1} in domains
    assert {"domain": "news.example.com", "discovered": 1, "fetched": 0} in domains
    assert rules["blocked_items"] == 1 and rules["ssrf"]["schemes"] == ["http", "https"]
    assert pages["events"][0]["counts"]["outcomes"] == {"ok": 1, "blocked": 1}
    assert searches["events"][0]["counts"]["searches.results"] == 2
    assert cleared == {"deleted": 2} and refused_clear.status_code == 403


def test_identity_from_an_untrusted_address_is_ignored(tmp_path):
    config = managed(tmp_path, management_trusted_proxies="10.0.0.0/8")  # the client here is 127.0.0.1
    with background(rest_app(ServeSettings(), config)) as base:
        answer = httpx.get(base + "/manage/my/memory", headers=as_user("mallory"))
        manifest = httpx.get(base + "/manage/manifest", headers=as_user("mallory")).json()
    assert answer.status_code == 403 and "not in management_trusted_proxies" in answer.json()["message"]
    assert manifest["you"]["identified"] is False


def test_management_token_passes_the_api_token_guard(tmp_path):
    config = managed(tmp_path)
    with background(rest_app(ServeSettings(token=API_TOKEN), config)) as base:
        assert httpx.get(base + "/manage/health").status_code == 401  # the guard: no token at all
        with_api = httpx.get(base + "/manage/health", headers={"Authorization": "Bearer " + API_TOKEN})
        with_management = httpx.get(base + "/manage/health", headers={"Authorization": "Bearer " + MANAGEMENT_TOKEN})
    assert with_api.status_code == 401 and with_api.json()["code"] == "unauthorized"  # past the guard, not the view's
    assert "management_token" in with_api.json()["message"]
    assert with_management.status_code == 200


def test_management_off_has_no_rest_views(tmp_path):
    config = managed(tmp_path, management=False)
    with background(rest_app(ServeSettings(), config)) as base:
        assert httpx.get(base + "/manage/manifest").status_code == 404


def test_tokens_too_short_are_refused(tmp_path):
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(ValidationError):
        TinyContextConfig(management_token="x" * 23)
    with pytest.raises(ValidationError):
        TinyContextConfig(management_proxy_token="y" * 31)
    with pytest.raises(ConfigError) as err:
        load_config(env={"TINYCONTEXT_MANAGEMENT_TOKEN": "sesame-short", "TINYCONTEXT_CONFIG_PATH": str(tmp_path / "c.json")})
    assert "at least 24" in str(err.value) and "sesame" not in str(err.value)  # a secret is never echoed
    with pytest.raises(ConfigError):
        load_config(env={"TINYCONTEXT_MANAGEMENT_TRUSTED_PROXIES": "not-a-network", "TINYCONTEXT_CONFIG_PATH": str(tmp_path / "c.json")})


def test_management_over_http_without_access_control_refuses_to_start(tmp_path):
    bare = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", management=True)
    for build in (mcp_app, rest_app):
        with pytest.raises(ConfigError, match="Refusing to serve management over HTTP"):
            build(ServeSettings(), bare)
    with pytest.raises(ConfigError, match="go together"):
        mcp_app(ServeSettings(), bare.model_copy(update={"management_trusted_proxies": ("127.0.0.1/32",)}))
    env = {**server_env(tmp_path), "TINYCONTEXT_MANAGEMENT": "on"}
    done = subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", "serve", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "Refusing to serve management over HTTP" in done.stderr


def test_real_web_calls_feed_the_page_search_and_domain_views(loopback_only, tmp_path, site):
    """search and scrape_urls over REST against a local page and a fake SearXNG: history mode keeps their
    counts and outcomes (no query, URL or domain in the file's bytes), content mode also the domains."""
    from test_activity import MARKER, file_bytes

    def calls(base: str) -> None:
        scraped = httpx.post(base + "/scrape_urls", headers=as_user("dora"), timeout=120, json={
            "items": [{"url": site.url("/rivers"), "query": f"Rhine floods {MARKER}"}, {"url": site.url("/missing")}]})
        found = httpx.post(base + "/search", headers=as_user("dora"), timeout=60,
                           json={"items": [{"query": f"danube {MARKER}"}]})
        assert scraped.status_code == 200 and found.status_code == 200

    operator = {"Authorization": "Bearer " + MANAGEMENT_TOKEN}
    seen = {}
    for mode in ("history", "content"):
        config = web_config(tmp_path, site, activity=mode, activity_db=tmp_path / mode / "activity.db", management=True,
                            management_token=MANAGEMENT_TOKEN, management_trusted_proxies="127.0.0.1/32",
                            management_proxy_token=PROXY_TOKEN)
        with background(rest_app(ServeSettings(), config)) as base:
            calls(base)
            seen[mode] = {path: httpx.get(base + path, headers={**operator, **as_user("dora")}).json()
                          for path in ("/manage/my/pages", "/manage/my/searches", "/manage/domains")}
        raw = file_bytes(config.activity_db)
        assert (MARKER.encode() in raw) == (mode == "content") and (b"rivers" in raw) == (mode == "content")
    history, content = seen["history"], seen["content"]
    (page,) = history["/manage/my/pages"]["events"]
    assert page["operation"] == "scrape_urls" and page["counts"]["outcomes"] == {"ok": 1, "http_error": 1}
    (search,) = history["/manage/my/searches"]["events"]
    assert search["counts"]["outcomes"] == {"ok": 1} and search["counts"]["searches.results"] >= 1
    assert "request" not in page and "shown" not in page and history["/manage/domains"]["domains"] == []
    domains = {d["domain"]: d for d in content["/manage/domains"]["domains"]}
    assert domains["127.0.0.1"]["fetched"] == 1 and "en.wikipedia.org" in domains  # a fake SearXNG result
    assert MARKER in content["/manage/my/searches"]["events"][0]["request"]["items"][0]["query"]

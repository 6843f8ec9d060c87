"""Activity records (activity=history|content): the owner-only file, what each mode keeps (read from the
file's bytes), retention, salted caller hashes; recorded through the real stdio MCP server and the REST app."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from netguard import LocalServer, send
from test_browser import needs_browser
from tinycontext import TinyContextConfig, close_engines
from tinycontext.activity import ActivityLog, Event, close_activity, open_activity
from tinycontext.servers.http import ServeSettings, background, rest_app
from tinycontext.web.browser.service import close_services

SERVER = [sys.executable, "-m", "tinycontext.cli.commands", "mcp"]
MARKER = "zebracorn-7f3q"  # planted in every query, text and URL; history mode must keep none of it


def file_bytes(path: Path) -> bytes:
    return b"".join(Path(f"{path}{side}").read_bytes() for side in ("", "-wal") if Path(f"{path}{side}").exists())


def mode_of(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def _closed():
    yield
    close_activity()
    close_engines()


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "config.json").write_text("{}")
    return {**{k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")},
            "TINYCONTEXT_CONFIG_PATH": str(tmp_path / "config.json"), "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "memory.db"),
            "TINYCONTEXT_MODELS_DIR": str(tmp_path / "models"), "TINYCONTEXT_EMBEDDING_BACKEND": "none",
            "TINYCONTEXT_ACTIVITY_DB": str(tmp_path / "records" / "activity.db"), "TINYCONTEXT_TOOLS": "memory,manage", **extra}


def run_stdio(env: dict[str, str], scenario):
    async def main():
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=env)
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return await scenario(session)

    return anyio.run(main)


async def memory_calls(session: ClientSession) -> None:
    saved = await session.call_tool("save_memories", {"memories": [{"content": f"The {MARKER} project ships on Fridays."}]})
    assert not saved.isError
    recalled = await session.call_tool("recall_memories", {"query": f"when does {MARKER} ship"})
    assert not recalled.isError and MARKER in recalled.content[0].text
    failed = await session.call_tool("get_memory", {"id": 999_999})
    assert failed.isError


def test_file_is_owner_only_under_a_permissive_umask(tmp_path):
    path = tmp_path / "new" / "deeper" / "activity.db"
    old = os.umask(0)
    try:
        log = ActivityLog(path, mode="history", retention_days=7, max_events=100)
        log.record(Event("search", "ok", 5, "stdio", caller="local:operator", answer={"searches": []}))
    finally:
        os.umask(old)
    assert mode_of(path) == 0o600
    assert mode_of(path.parent) == 0o700 and mode_of(path.parent.parent) == 0o700
    for side in ("-wal", "-shm"):  # SQLite gives its side files the database file's mode
        assert mode_of(f"{path}{side}") == 0o600
    log.close()
    os.chmod(path, 0o644)  # someone loosened it: opening sets it back
    ActivityLog(path, mode="history", retention_days=7, max_events=100).close()
    assert mode_of(path) == 0o600


def test_history_mode_over_stdio_keeps_counts_and_no_content(tmp_path):
    env = server_env(tmp_path, TINYCONTEXT_ACTIVITY="on")  # "on" is the history mode
    run_stdio(env, memory_calls)
    db = tmp_path / "records" / "activity.db"
    raw = file_bytes(db)
    assert MARKER.encode() not in raw and b"Fridays" not in raw and b"local:operator" not in raw
    log = ActivityLog(db, mode="history", retention_days=7, max_events=100)
    events = log.events(log.caller_hash("local:operator"), ["save_memories", "recall_memories", "get_memory"])
    assert [(e["operation"], e["outcome"]) for e in events] == [
        ("get_memory", "memory_not_found"), ("recall_memories", "ok"), ("save_memories", "ok")]
    assert events[2]["counts"]["ids"] == 1 and events[1]["counts"]["memories"] == 1
    assert all(set(e) == {"at", "operation", "outcome", "duration_ms", "counts", "transport"} for e in events)
    assert {e["transport"] for e in events} == {"stdio"}
    log.close()


def test_content_mode_keeps_what_the_model_was_shown(tmp_path):
    env = server_env(tmp_path, TINYCONTEXT_ACTIVITY="content")
    run_stdio(env, memory_calls)
    db = tmp_path / "records" / "activity.db"
    assert MARKER.encode() in file_bytes(db)
    log = ActivityLog(db, mode="content", retention_days=7, max_events=100)
    recall = log.events(log.caller_hash("local:operator"), ["recall_memories"])[0]
    assert recall["request"]["query"] == f"when does {MARKER} ship"
    assert f"The {MARKER} project ships on Fridays." in recall["shown"]
    log.close()
    # Back to history mode: the content kept so far is wiped on open, its bytes overwritten (secure_delete).
    ActivityLog(db, mode="history", retention_days=7, max_events=100).close()
    assert MARKER.encode() not in file_bytes(db)


def test_retention_and_max_events_prune_on_write(tmp_path):
    now = [1_000_000.0]
    log = ActivityLog(tmp_path / "a.db", mode="history", retention_days=7, max_events=3, clock=lambda: now[0])
    log.record(Event("search", "ok", 1, "stdio", caller="u"))
    now[0] += 8 * 86_400  # older than 7 days at the next write
    for n in range(5):
        log.record(Event("search", "ok", n, "stdio", caller="u"))
        now[0] += 1
    events = log.events(log.caller_hash("u"), ["search"], limit=100)
    assert [e["duration_ms"] for e in events] == [4, 3, 2]  # the newest three; the old one went first
    assert log.summary()["events"] == 3
    log.close()


def test_callers_are_salted_hashes(tmp_path):
    one = ActivityLog(tmp_path / "one.db", mode="history", retention_days=7, max_events=10)
    two = ActivityLog(tmp_path / "two.db", mode="history", retention_days=7, max_events=10)
    identity = "user:alice@example.org"
    assert one.caller_hash(identity) != two.caller_hash(identity)  # a salt per file: not linkable across files
    assert len(one.caller_hash(identity)) == 64 and one.caller_hash(identity) != one.caller_hash("user:bob")
    one.record(Event("save_memories", "ok", 1, "rest", caller=identity))
    one.close()
    assert b"alice" not in file_bytes(tmp_path / "one.db")
    again = ActivityLog(tmp_path / "one.db", mode="history", retention_days=7, max_events=10)
    assert again.caller_hash(identity) == one.caller_hash(identity)  # the salt is kept in the file
    assert len(again.events(again.caller_hash(identity), ["save_memories"])) == 1
    again.close()
    two.close()


def test_rest_calls_are_recorded_once_each(tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend="none",
                               activity="content", activity_db=tmp_path / "act" / "activity.db")
    with background(rest_app(ServeSettings(), config)) as base:
        saved = httpx.post(f"{base}/save_memories", json={"memories": [{"content": f"{MARKER} is blue"}]})
        bad = httpx.post(f"{base}/get_memory", json={"id": 424242})
        httpx.get(f"{base}/health")  # not a tool: not recorded
        sessions = httpx.get(f"{base}/sessions")
    assert saved.status_code == 200 and bad.status_code == 404 and sessions.status_code == 200
    log = open_activity(config)
    assert log.summary()["by_operation"] == {"save_memories": {"ok": 1}, "get_memory": {"memory_not_found": 1},
                                             "list_sessions": {"ok": 1}}
    assert log.summary()["unidentified_events"] == 3  # REST without a trusted identity
    (save,) = log.events(None, ["save_memories"])
    assert save["transport"] == "rest" and save["request"]["memories"][0]["content"] == f"{MARKER} is blue"
    assert json.loads(save["shown"]) == saved.json()


def test_rest_history_mode_reads_no_request_body(tmp_path, monkeypatch):
    from tinycontext.servers import activity as recorder
    parsed = []
    real = recorder._json
    monkeypatch.setattr(recorder, "_json", lambda raw: parsed.append(bytes(raw)) or real(raw))
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend="none",
                               activity="on", activity_db=tmp_path / "act" / "activity.db")
    with background(rest_app(ServeSettings(), config)) as base:
        saved = httpx.post(f"{base}/save_memories", json={"memories": [{"content": f"{MARKER} is blue"}]})
    assert saved.status_code == 200
    # Only the answer was parsed (its counts are kept); the request, whose content history mode drops, never was.
    assert parsed == [saved.content] and not any(MARKER.encode() in raw for raw in parsed)
    (save,) = open_activity(config).events(None, ["save_memories"])
    assert save["counts"]["ids"] == 1 and "request" not in save and "shown" not in save
    assert MARKER.encode() not in file_bytes(tmp_path / "act" / "activity.db")


@needs_browser
def test_browser_actions_over_rest_are_recorded_with_the_domain_they_read(tmp_path):
    page = f"<!doctype html><title>Notes</title><main><h1>{MARKER} notes</h1><a href='/next'>Next page</a></main>".encode()
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend="none",
                               activity="content", activity_db=tmp_path / "act" / "activity.db", allow_private_hosts=True)
    with LocalServer({"/": lambda h: send(h, 200, page)}) as site, background(rest_app(ServeSettings(), config)) as base:
        try:
            opened = httpx.post(f"{base}/browser/navigate", json={"url": site.url("/", host="pages.localhost")}, timeout=60)
            looked = httpx.post(f"{base}/browser/act", json={"action": "look"}, timeout=60)
            failed = httpx.post(f"{base}/browser/act", json={"action": "click", "ref": "e999"}, timeout=60)
        finally:
            close_services()
    assert opened.status_code == looked.status_code == 200 and MARKER in opened.json()["view"]
    assert failed.status_code >= 400
    log = open_activity(config)
    events = log.events(None, ["browser_navigate", "browser_act"])
    assert [(e["operation"], e["outcome"]) for e in events] == [
        ("browser_act", failed.json()["code"]), ("browser_act", "ok"), ("browser_navigate", "ok")]
    navigate = events[-1]
    assert navigate["domains"] == {"discovered": [], "fetched": ["pages.localhost"]} and MARKER in navigate["shown"]
    assert navigate["request"]["url"] == site.url("/", host="pages.localhost")
    assert {"domain": "pages.localhost", "discovered": 0, "fetched": 2} in log.domains()


def test_activity_off_writes_nothing(tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend="none",
                               activity_db=tmp_path / "act" / "activity.db")
    assert config.activity == "off" and open_activity(config) is None
    with background(rest_app(ServeSettings(), config)) as base:
        assert httpx.post(f"{base}/save_memories", json={"memories": [{"content": "x"}]}).status_code == 200
    assert not (tmp_path / "act").exists()

"""The memory browser's page and API over real HTTP (uvicorn on loopback, httpx): files served by the
package, the same guard as REST, CSRF refusals, and each action the page offers. The page itself is
driven in Chromium by tests/test_ui_browser.py."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background
from tinycontext.servers.ui import STATIC, UI_HEADER

TOKEN = "ui-test-token-0123456789abcdef"
UI = {UI_HEADER: "1"}


@pytest.fixture
def served(hash_engine):
    hash_engine.save([{"content": "The staging database is Postgres 16", "tags": ["db"], "metadata": {"source": "chat"}},
                      {"content": "Releases happen on Tuesdays", "tags": ["process"]}], session_id="proj")
    hash_engine.save([{"content": "I adopted a puppy named Rex", "speaker": "Caroline"},
                      {"content": "Rex chewed my shoes", "speaker": "Melanie"}], session_id="chat")
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        with httpx.Client(base_url=base, timeout=30, headers=UI) as client:
            yield client


def test_page_and_assets_come_from_the_package_and_name_no_other_origin(served):
    page = served.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    referenced = set(re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', page.text))
    assert referenced == {f"/ui/static/{name}" for name in STATIC if name != "index.html"}
    for path in referenced:
        asset = served.get(path)
        assert asset.status_code == 200 and asset.headers["x-content-type-options"] == "nosniff"
        # No absolute URL at all: a CDN script, a web font or an analytics beacon would need one.
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", asset.text, re.I), path
    assert served.get("/ui/static/secret.py").status_code == 404
    assert served.get("/ui/static/..%2Fui.py").status_code == 404
    # The page's API is not part of the REST contract (docs/rest.md is generated from this schema).
    assert not [p for p in served.get("/openapi.json").json()["paths"] if p.startswith("/ui")]


def test_overview_lists_sessions_with_counts_and_tokens(served, hash_engine):
    data = served.get("/ui/api/overview").json()
    by_id = {s["session_id"]: s for s in data["sessions"]}
    assert by_id["proj"]["memories"] == 2 and by_id["chat"]["memories"] == 2
    assert by_id["proj"]["tokens"] == sum(m["tokens"] for m in hash_engine.list_memories(session_id="proj", detail="full").structured["memories"])
    assert data["memories"] == 4 and data["embedder"] == "hash-test"


def test_search_shows_the_agents_answer_cost_and_every_score(served, hash_engine):
    data = served.post("/ui/api/search", json={"query": "which database for staging", "session_id": "proj"}).json()
    top = data["ranked"][0]
    assert top["content"] == "The staging database is Postgres 16" and top["rank"] == 1 and top["in_answer"]
    assert set(top["scores"]) == {"bm25", "dense", "rrf"} and top["scores"]["bm25"] > 0
    # The cost shown is the cost of exactly what an agent receives from recall_memories.
    agent = hash_engine.recall_rendered("which database for staging", session_id="proj")
    assert data["answer"]["text"] == agent.text and data["answer"]["text_tokens"] == agent.text_tokens
    assert data["answer"]["ids"] == sorted(m["id"] for m in agent.structured["memories"])
    small = served.post("/ui/api/search", json={"query": "which database for staging", "session_id": "proj", "max_tokens": 64}).json()
    assert small["answer"]["max_tokens"] == 64 and small["answer"]["text_tokens"] <= 64


def test_one_search_ranks_once_for_the_answer_and_the_ranking(served, monkeypatch):
    from tinycontext.memory import recall as pipeline
    orders = []
    real = pipeline.order
    monkeypatch.setattr(pipeline, "order", lambda *a, **k: orders.append(1) or real(*a, **k))
    data = served.post("/ui/api/search", json={"query": "which database for staging", "top_k": 1}).json()
    # Fusion and re-ranking ran once; the answer and the ranking shown are two renderings of that order.
    assert len(orders) == 1
    assert len(data["answer"]["ids"]) == 1 and data["answer"]["ids"] == [m["id"] for m in data["ranked"]]


def test_superseded_facts_are_marked_and_search_prefers_current_ones(served, hash_engine):
    old = hash_engine.save([{"content": "The office wifi password is apple-pie"}], session_id="proj")["ids"][0]
    new = hash_engine.save([{"content": "The office wifi password is banana-split", "supersedes": old}], session_id="proj")["ids"][0]
    shown = served.get(f"/ui/api/memory/{old}").json()
    assert shown["superseded_by"] == new and shown["valid_until"]
    assert "superseded_by" not in served.get(f"/ui/api/memory/{new}").json()
    current = served.post("/ui/api/search", json={"query": "office wifi password"}).json()
    assert old not in [m["id"] for m in current["ranked"]] and current["superseded"] == 1
    everything = served.post("/ui/api/search", json={"query": "office wifi password", "include_superseded": True}).json()
    marked = {m["id"]: m.get("superseded_by") for m in everything["ranked"]}
    assert marked[old] == new and marked[new] is None


def test_list_filters_by_speaker_tags_metadata_and_dates(served):
    def ids(**body):
        return [m["content"] for m in served.post("/ui/api/list", json=body).json()["memories"]]

    assert ids(speaker="Caroline") == ["I adopted a puppy named Rex"]
    assert ids(tags=["process"]) == ["Releases happen on Tuesdays"]
    assert ids(filters={"metadata": {"source": "chat"}}) == ["The staging database is Postgres 16"]
    assert len(ids(filters={"created_at": {"gte": "2000-01-01"}})) == 4
    assert ids(filters={"created_at": {"lt": "2000-01-01"}}) == []
    assert served.post("/ui/api/list", json={"speaker": ""}).json()["code"] == "invalid_input"


def test_edit_keeps_history_and_a_stale_edit_is_a_conflict(served):
    memory = served.post("/ui/api/list", json={"tags": ["db"]}).json()["memories"][0]
    edited = served.post(f"/ui/api/memory/{memory['id']}", json={"content": "The staging database is Postgres 17",
                                                                 "expected_version": memory["version"]}).json()
    assert edited["version"] == memory["version"] + 1
    history = served.get(f"/ui/api/memory/{memory['id']}").json()["history"]
    assert [h["content"] for h in history] == ["The staging database is Postgres 16"]
    stale = served.post(f"/ui/api/memory/{memory['id']}", json={"content": "x", "expected_version": memory["version"]})
    assert stale.status_code == 409 and stale.json()["code"] == "conflict"


def test_delete_and_bulk_delete_after_a_dry_run(served):
    memory = served.post("/ui/api/list", json={"tags": ["process"]}).json()["memories"][0]
    assert served.delete(f"/ui/api/memory/{memory['id']}").json() == {"id": memory["id"], "deleted": True}
    assert served.get(f"/ui/api/memory/{memory['id']}").status_code == 404
    dry = served.post("/ui/api/delete_memories", json={"session_id": "chat"}).json()
    assert dry == {**dry, "matched": 2, "deleted": 0, "dry_run": True}
    wrong = served.post("/ui/api/delete_memories", json={"session_id": "chat", "dry_run": False, "confirm": 1})
    assert wrong.status_code == 400 and served.post("/ui/api/list", json={"session_id": "chat"}).json()["total"] == 2
    by_speaker = served.post("/ui/api/delete_memories", json={"speaker": "Melanie"}).json()
    assert by_speaker["matched"] == 1
    done = served.post("/ui/api/delete_memories", json={"session_id": "chat", "dry_run": False, "confirm": 2}).json()
    assert done["deleted"] == 2 and served.post("/ui/api/list", json={"session_id": "chat"}).json()["total"] == 0


def test_export_downloads_the_jsonl_that_import_reads(served, tmp_path):
    from tinycontext import MemoryEngine, TinyContextConfig
    from tinycontext.memory.transfer import import_jsonl
    from conftest import HashEmbedder

    answer = served.get("/ui/api/export", params={"session_id": "proj"})
    assert answer.status_code == 200 and "attachment" in answer.headers["content-disposition"]
    records = [json.loads(line) for line in answer.text.splitlines()]
    assert records[0]["type"] == "header" and sum(r["type"] == "memory" for r in records) == 2
    assert served.get("/ui/api/export", params={"session_id": "nope"}).status_code == 404
    (tmp_path / "export.jsonl").write_text(answer.text)
    config = TinyContextConfig(memory_db_path=tmp_path / "copy.db", models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as copy, open(tmp_path / "export.jsonl") as stream:
        import_jsonl(copy, stream)
        assert copy.stats()["memories"] == 2


@pytest.mark.parametrize("headers, code", [
    ({}, "forbidden"),  # no UI header: what a form post or an <img>/<script> tag sends
    ({**UI, "Origin": "http://evil.test"}, "invalid_origin"),  # the guard's rule for every app
    ({**UI, "Origin": "http://127.0.0.1:1"}, "invalid_origin"),  # another loopback server's page is still another origin
    ({**UI, "Sec-Fetch-Site": "cross-site"}, "forbidden"),
    ({**UI, "Sec-Fetch-Site": "same-site"}, "forbidden"),
])
def test_cross_origin_calls_are_refused_and_write_nothing(served, headers, code):
    memory = served.post("/ui/api/list", json={"tags": ["db"]}).json()["memories"][0]
    base = str(served.base_url)
    with httpx.Client(base_url=base, timeout=30) as bare:
        for answer in (bare.post(f"/ui/api/memory/{memory['id']}", json={"content": "planted"}, headers=headers),
                       bare.delete(f"/ui/api/memory/{memory['id']}", headers=headers),
                       bare.get("/ui/api/export", headers=headers)):
            assert answer.status_code == 403 and answer.json()["code"] == code
    assert served.get(f"/ui/api/memory/{memory['id']}").json()["content"] == memory["content"]


def test_own_origin_is_accepted(served):
    origin = str(served.base_url).rstrip("/")
    assert served.get("/ui/api/overview", headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"}).status_code == 200


def test_token_guards_the_api_but_not_the_static_page(hash_engine):
    with background(create_app(engine=hash_engine, settings=ServeSettings(token=TOKEN))) as base:
        with httpx.Client(base_url=base, timeout=30, headers=UI) as client:
            assert client.get("/ui").status_code == 200 and client.get("/ui/static/app.js").status_code == 200
            assert client.get("/ui/api/overview").status_code == 401
            assert client.get("/ui/api/overview", headers={"Authorization": "Bearer wrong" + TOKEN}).status_code == 401
            assert client.get("/ui/api/overview", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
            # The open paths are exact: nothing else under /ui, and no other route, skips the token.
            assert client.get("/ui/").status_code == 401 and client.get("/ui/apix").status_code == 401 and client.get("/health").status_code == 401
            # Host is still checked on the open paths (DNS rebinding).
            assert client.get("/ui", headers={"Host": "evil.test"}).status_code == 421


def test_every_asset_ships_in_the_wheel_and_is_served():
    """Each file in ui_static matches a package-data pattern (so the wheel has it; checked by building
    one with setuptools 84 this session) and is one the server serves: no stray file, no missing one."""
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tinycontext"]
    files = sorted((repo / "tinycontext" / "servers" / "ui_static").iterdir())
    assert {f.name for f in files} == set(STATIC)
    for path in files:
        relative = path.relative_to(repo / "tinycontext")
        assert any(relative.match(pattern) for pattern in patterns), relative


def test_the_ui_command_serves_the_page_on_loopback_and_prints_its_url(env):
    """`tinycontext ui --no-open`: MCP_HOST is ignored (loopback only), port 0 picks a free port, and the
    printed URL is the page; SIGTERM stops it cleanly."""
    import os
    import signal
    import subprocess
    import sys

    full = {**os.environ, **env, "MCP_HOST": "0.0.0.0"}
    process = subprocess.Popen([sys.executable, "-m", "tinycontext.cli.commands", "ui", "--no-open"], env=full,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("Memory browser: http://127.0.0.1:") and line.rstrip().endswith("/ui"), (line, process.stderr.read())
        url = line.split(": ", 1)[1].strip()
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "/ui/static/app.js" in page.text
        base = url.removesuffix("/ui")
        assert httpx.get(base + "/ui/api/overview", headers=UI, timeout=30).json()["memories"] == 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err

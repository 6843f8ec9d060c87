"""Browsing and housekeeping: list_memories within a budget, sessions, bulk delete with a dry run, expiry."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tinycontext import InvalidInputError, SessionNotFoundError, TinyContextConfig
from tinycontext.budget.render import to_json
from tinycontext.memory.store import Store


def contents(page):
    return [m["content"] for m in page.structured["memories"]]


@pytest.fixture
def filled(hash_engine):
    hash_engine.save([{"content": f"work note {i}", "tags": ["work"] + (["urgent"] if i % 3 == 0 else [])} for i in range(10)],
                     session_id="work")
    hash_engine.save([{"content": f"home note {i}", "tags": ["home"], "metadata": {"room": "kitchen" if i % 2 else "hall"}}
                      for i in range(6)], session_id="home")
    return hash_engine


def test_speaker_filter_checks_names_as_saving_does(hash_engine):
    hash_engine.save([{"content": "I adopted a puppy", "speaker": "Mary  Ann"}, {"content": "Nice!", "speaker": "Bob"}],
                     session_id="chat")
    # Saving collapses a name's whitespace; the filter compares the name the same way.
    assert contents(hash_engine.list_memories(speaker=" Mary   Ann ")) == ["I adopted a puppy"]
    assert hash_engine.delete_memories(speaker="Mary\tAnn")["matched"] == 1
    for bad in ("", "   ", "x" * 101, "Bob\x00"):
        with pytest.raises(InvalidInputError, match="speaker must be text of 1-100 characters"):
            hash_engine.list_memories(speaker=bad)


def test_list_orders_pages_and_filters(filled):
    page = filled.list_memories(session_id="work", order="oldest", limit=4)
    assert contents(page) == [f"work note {i}" for i in range(4)]
    assert page.structured["total"] == 10 and page.structured["next_offset"] == 4
    assert page.text.splitlines()[0].startswith("10 memories; showing 4 from offset 0") and "offset=4" in page.text
    rest = filled.list_memories(session_id="work", order="oldest", offset=8, limit=4)
    assert contents(rest) == ["work note 8", "work note 9"] and rest.structured["next_offset"] is None
    assert contents(filled.list_memories(order="newest", limit=1)) == ["home note 5"]
    assert set(contents(filled.list_memories(tags=["urgent"]))) == {"work note 0", "work note 3", "work note 6", "work note 9"}
    assert set(contents(filled.list_memories(filters={"metadata": {"room": "kitchen"}}))) == {"home note 1", "home note 3", "home note 5"}
    assert filled.list_memories(filters={"tags_all": ["work", "home"]}).text == "No memories."


def test_list_fits_the_token_budget(filled):
    filled.save([{"content": "long " * 400, "tags": ["work"]}], session_id="work")
    page = filled.list_memories(max_tokens=120, limit=100)
    assert page.text_tokens <= 120 and filled.tokens.count(to_json(page.structured)) <= 120
    assert "long long" not in page.text and page.structured["truncated"] and page.structured["next_offset"] is not None
    full = filled.list_memories(limit=100, max_tokens=100_000)
    assert len(full.structured["memories"]) == 17


def test_list_bad_input(filled):
    for bad in ({"order": "random"}, {"limit": 0}, {"limit": 5000}, {"offset": -1}, {"filters": {"nope": 1}},
                {"tags": "work"}, {"max_tokens": 3}):
        with pytest.raises(InvalidInputError):
            filled.list_memories(**bad)
    with pytest.raises(SessionNotFoundError):
        filled.list_memories(session_id="nope")


def test_sessions_with_counts(filled):
    sessions = {s["session_id"]: s["memories"] for s in filled.list_sessions()["sessions"]}
    assert sessions == {"work": 10, "home": 6}


def test_bulk_delete_needs_a_dry_run_count(filled):
    before = filled.stats()["memories"]
    dry = filled.delete_memories(tags=["urgent"])
    assert dry["dry_run"] and dry["matched"] == 4 and dry["deleted"] == 0 and filled.stats()["memories"] == before
    with pytest.raises(InvalidInputError):
        filled.delete_memories(tags=["urgent"], dry_run=False)  # no confirm
    with pytest.raises(InvalidInputError, match="now matches 4"):
        filled.delete_memories(tags=["urgent"], dry_run=False, confirm=3)
    assert filled.stats()["memories"] == before
    with pytest.raises(InvalidInputError, match="deleting everything"):
        filled.delete_memories(dry_run=False, confirm=before)
    done = filled.delete_memories(tags=["urgent"], dry_run=False, confirm=4)
    assert done == {"matched": 4, "deleted": 4, "dry_run": False}
    assert filled.stats()["memories"] == before - 4 == filled.stats()["vectors"]
    assert not filled.store.read("SELECT 1 FROM memory_tags WHERE tag = 'urgent'")
    # Recall (dense and BM25) no longer sees them, and the in-RAM index stayed coherent.
    assert "work note 0" not in [m["content"] for m in filled.recall("work note 0", dense_weight=1.0)["memories"]]
    assert filled.delete_memories(session_id="home", filters={"metadata": {"room": "hall"}})["matched"] == 3
    assert filled.delete_memories(session_id="home", dry_run=False, confirm=6)["deleted"] == 6
    assert [s["memories"] for s in filled.list_sessions()["sessions"] if s["session_id"] == "home"] == [0]


def test_expiry_is_enforced_on_recall_and_listing_and_cleaned_up(hash_engine):
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()
    out = hash_engine.save([{"content": "temporary door code 4711", "expires_at": past},
                            {"content": "permanent door colour red"},
                            {"content": "door code for tomorrow", "ttl_seconds": 3600}])
    gone, kept, later = out["ids"]
    stored = dict(hash_engine.store.read("SELECT id, expires_at FROM memories"))
    assert stored[kept] is None and stored[later] > datetime.now(timezone.utc).isoformat()
    for weight in (0.0, 0.5, 1.0):
        assert gone not in [m["id"] for m in hash_engine.recall("door code", dense_weight=weight)["memories"]]
    assert not hash_engine.store.read("SELECT 1 FROM memories WHERE id = ?", (gone,))  # cleaned up, vectors too
    assert not hash_engine.store.read("SELECT 1 FROM memory_vectors WHERE memory_id = ?", (gone,))
    assert {m["id"] for m in hash_engine.list_memories().structured["memories"]} == {kept, later}
    for bad in ({"content": "x", "ttl_seconds": 0}, {"content": "x", "expires_at": "soon"},
                {"content": "x", "ttl_seconds": 5, "expires_at": past}, {"content": "x", "ttl_seconds": 10**12}):
        with pytest.raises(InvalidInputError):
            hash_engine.save([bad])


def test_migration_from_v2_keeps_every_memory(tmp_path):
    from tinycontext import MemoryEngine
    from conftest import HashEmbedder

    path = tmp_path / "old.db"
    old = Store(path, target_version=2)
    with old.write() as conn:
        conn.execute("INSERT INTO sessions VALUES ('default', '2024-01-01')")
        for i in (3, 7):
            conn.execute("INSERT INTO memories(id, session_id, content, content_hash, tokens, created_at) "
                         "VALUES (?, 'default', ?, ?, 2, '2024-01-01T00:00:00.000000+00:00')", (i, f"old memory {i}", str(i)))
    old.close()
    config = TinyContextConfig(memory_db_path=path, models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        assert engine.store.schema_version >= 3
        assert [m["id"] for m in engine.list_memories(order="id").structured["memories"]] == [3, 7]
        engine.store.migrate()  # re-running changes nothing
        assert [r[0] for r in engine.store.read("SELECT id FROM memories ORDER BY id")] == [3, 7]
        assert engine.save(["new one"])["ids"] == [8]


# -- adapters ---------------------------------------------------------------------------------


def test_cli_list_and_forget(env, capsys):
    from tinycontext.cli.commands import main

    assert main(["save", "alpha one", "alpha two", "--tag", "a", "--session", "s1"]) == 0
    assert main(["save", "beta one", "--session", "s2"]) == 0
    capsys.readouterr()
    assert main(["list", "--order", "oldest", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["content"] for m in listed["memories"]] == ["alpha one", "alpha two", "beta one"] and listed["total"] == 3
    assert main(["list", "--session", "s1", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 memories; showing 1") and "offset=1" in out
    assert main(["forget", "--tag", "a"]) == 0
    assert "2 memories match; nothing deleted" in capsys.readouterr().out
    assert main(["forget", "--tag", "a", "--confirm", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == 2
    assert main(["forget"]) == 1
    assert capsys.readouterr().err.startswith("invalid_input")


def test_rest_browse(filled):
    import httpx

    from tinycontext.servers.fastapi_server import create_app
    from tinycontext.servers.http import ServeSettings, background

    with background(create_app(engine=filled, settings=ServeSettings())) as base, httpx.Client(base_url=base, timeout=30) as api:
        listed = api.post("/list_memories", json={"session_id": "home", "order": "oldest", "limit": 2}).json()
        assert [m["content"] for m in listed["memories"]] == ["home note 0", "home note 1"] and listed["next_offset"] == 2
        assert api.post("/list_memories", json={"order": "sideways"}).json()["code"] == "invalid_input"
        assert {s["session_id"] for s in api.get("/sessions").json()["sessions"]} == {"work", "home"}
        dry = api.post("/delete_memories", json={"session_id": "home"}).json()
        assert dry["matched"] == 6 and dry["deleted"] == 0
        assert api.post("/delete_memories", json={"session_id": "home", "dry_run": False}).status_code == 400
        assert api.post("/delete_memories", json={"session_id": "home", "dry_run": False, "confirm": 6}).json()["deleted"] == 6
        assert api.post("/delete_memories", json={"session_id": "nope"}).status_code == 404


def test_mcp_browse(tmp_path):
    import anyio
    from mcp.shared.memory import create_connected_server_and_client_session

    from tinycontext import close_engines
    from tinycontext.servers.mcp_server import build_server

    server = build_server(TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", tools="memory,manage"))

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"list_memories", "list_sessions", "delete_memories"} <= names
            await client.call_tool("save_memories", {"session_id": "p", "memories": [
                {"content": "Project p uses Rust", "tags": ["p"]}, {"content": "Project p ships monthly", "tags": ["p"]}]})
            listed = await client.call_tool("list_memories", {"order": "oldest"})
            assert [m["content"] for m in listed.structuredContent["memories"]] == ["Project p uses Rust", "Project p ships monthly"]
            assert "Project p uses Rust" in listed.content[0].text
            sessions = await client.call_tool("list_sessions", {})
            assert sessions.structuredContent["sessions"][0]["memories"] == 2
            dry = await client.call_tool("delete_memories", {"session_id": "p"})
            assert dry.structuredContent["matched"] == 2 and "confirm=2" in dry.content[0].text
            bad = await client.call_tool("delete_memories", {"session_id": "p", "dry_run": False})
            assert bad.isError and bad.content[0].text.startswith("invalid_input")
            done = await client.call_tool("delete_memories", {"session_id": "p", "dry_run": False, "confirm": 2})
            assert done.structuredContent["deleted"] == 2

    try:
        anyio.run(scenario)
    finally:
        close_engines()


def test_expiry_survives_export_and_import(hash_engine, tmp_path):
    import io

    from conftest import HashEmbedder
    from tinycontext import MemoryEngine
    from tinycontext.memory.transfer import export_jsonl, import_jsonl

    later = hash_engine.save([{"content": "door code for tomorrow", "ttl_seconds": 3600}, {"content": "door is red"}])["ids"]
    expected = dict(hash_engine.store.read("SELECT content, expires_at FROM memories"))
    buffer = io.StringIO()
    export_jsonl(hash_engine, buffer)
    with MemoryEngine(TinyContextConfig(memory_db_path=tmp_path / "copy.db"), embedder=HashEmbedder()) as copy:
        import_jsonl(copy, io.StringIO(buffer.getvalue()))
        assert dict(copy.store.read("SELECT content, expires_at FROM memories")) == expected
    assert expected["door code for tomorrow"] and expected["door is red"] is None and len(later) == 2

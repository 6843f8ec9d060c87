"""Ids are never reused (AUTOINCREMENT, with a migration that keeps every id) and import is
idempotent (a stable uid per memory), on real SQLite files."""

from __future__ import annotations

import io
import json

import numpy as np
from conftest import HashEmbedder
from consistency import assert_consistent

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.memory.store import MIGRATIONS, SCHEMA_VERSION, Store, now_iso
from tinycontext.memory.transfer import export_jsonl, import_jsonl

V2_ROWS = {1: ("work", "Rotate the deploy key monthly.", ["ops", "security"]), 2: ("work", "Standup is at 09:30.", ["meetings"]),
           5: ("home", "Water the ficus on Sundays.", []), 9: ("home", "The cat is called Miso.", ["pets"])}


def _config(path) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=path, models_dir=path.parent / "models")


def build_v2(path) -> None:
    """A database as schema v2 left it: ids with gaps, tag index, edit history, vectors."""
    store = Store(path, target_version=2)
    with store.write() as conn:
        for mid, (session, content, tags) in V2_ROWS.items():
            stamp = now_iso()
            conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (session, stamp))
            conn.execute("INSERT INTO memories(id, session_id, content, tags, metadata, content_hash, tokens, created_at, updated_at, version)"
                         " VALUES (?, ?, ?, ?, '{}', ?, 5, ?, ?, ?)", (mid, session, content, json.dumps(tags), f"h{mid}", stamp, stamp, 1 + (mid == 2)))
            conn.executemany("INSERT INTO memory_tags(memory_id, tag) VALUES (?, ?)", [(mid, t) for t in tags])
        conn.execute("INSERT INTO memory_versions VALUES (2, 1, 'Standup is at 09:00.', '[]', '{}', ?, ?)", (now_iso(), now_iso()))
    # Vectors as that version wrote them (today's bind_embedder reads columns v2 did not have).
    embedder = HashEmbedder()
    with store.write() as conn:
        conn.execute("CREATE VIRTUAL TABLE memory_vectors USING vec0(memory_id INTEGER PRIMARY KEY, session_id TEXT PARTITION KEY, "
                     f"embedding FLOAT[{embedder.dimensions}] distance_metric=cosine)")
        conn.executemany("INSERT INTO memory_vectors(memory_id, session_id, embedding) VALUES (?, ?, ?)",
                         [(mid, session, embedder.embed_documents([content])[0].tobytes()) for mid, (session, content, _) in V2_ROWS.items()])
        conn.execute("INSERT INTO meta(key, value) VALUES ('embedder', ?)", (json.dumps(embedder.identity, sort_keys=True),))
    assert store.schema_version == 2
    store.close()


def _snapshot(store: Store) -> tuple:
    return (store.read("SELECT id, session_id, content, tags, version, uid FROM memories ORDER BY id"),
            store.read("SELECT memory_id, tag FROM memory_tags ORDER BY 1, 2"),
            store.read("SELECT memory_id, version, content FROM memory_versions ORDER BY 1, 2"),
            store.read("SELECT memory_id, embedding FROM memory_vectors ORDER BY 1"))


def test_migration_keeps_every_id_and_ids_are_never_reused(tmp_path):
    path = tmp_path / "v2.db"
    build_v2(path)
    before = Store(path, target_version=2)
    vectors = before.read("SELECT memory_id, embedding FROM memory_vectors ORDER BY 1")
    before.close()
    with MemoryEngine(_config(path), embedder=HashEmbedder()) as engine:
        assert engine.store.schema_version == SCHEMA_VERSION and engine.reindexed == 0
        table = engine.store.read("SELECT sql FROM sqlite_master WHERE name = 'memories'")[0][0]
        assert "AUTOINCREMENT" in table.upper()
        rows, tags, history, now_vectors = _snapshot(engine.store)
        assert {r[0]: (r[1], r[2], json.loads(r[3])) for r in rows} == V2_ROWS  # every id with its row
        assert len({r[5] for r in rows}) == len(rows) and all(rows[i][5] for i in range(len(rows)))  # a uid each
        assert tags == sorted((mid, t) for mid, (_, _, ts) in V2_ROWS.items() for t in ts)  # not cascaded away
        assert history == [(2, 1, "Standup is at 09:00.")] and now_vectors == vectors
        assert_consistent(engine)
        assert [m["id"] for m in engine.recall("ficus Sundays", dense_weight=0.0)["memories"]][:1] == [5]
        # Delete the highest id: the next memory still gets a new one.
        engine.delete(9)
        assert engine.save(["A brand new memory."])["ids"] == [10]
        engine.delete(10)
        assert engine.save(["Another new memory."])["ids"] == [11]
        snapshot = _snapshot(engine.store)
        # Re-running the migration changes nothing.
        with engine.store.write() as conn:
            MIGRATIONS[5](conn)
        engine.store.migrate()
        assert _snapshot(engine.store) == snapshot
    with MemoryEngine(_config(path), embedder=HashEmbedder()) as engine:
        assert _snapshot(engine.store) == snapshot


def _source(tmp_path) -> str:
    with MemoryEngine(_config(tmp_path / "source.db"), embedder=HashEmbedder()) as engine:
        engine.save([{"content": "Alice prefers tabs", "tags": ["style"]}, "The release train leaves on Thursdays"], session_id="team")
        engine.save([{"content": "Bob said hi", "speaker": "Bob", "occurred_at": "2023-05-08T13:56", "episode": "chat-1"}], session_id="bob")
        engine.update(1, "Alice prefers tabs, width 4")
        out = io.StringIO()
        export_jsonl(engine, out)
        return out.getvalue()


def _counts(engine) -> tuple:
    read = engine.store.read
    return tuple(read(f"SELECT count(*) FROM {t}")[0][0] for t in ("memories", "memory_vectors", "memory_tags", "memory_versions", "sessions"))


def test_import_twice_into_colliding_ids_adds_nothing(tmp_path):
    dump = _source(tmp_path)
    with MemoryEngine(_config(tmp_path / "target.db"), embedder=HashEmbedder()) as target:
        target.save(["Target one", "Target two", "Target three", "Target four"], session_id="team")  # ids 1-4 taken
        first = import_jsonl(target, io.StringIO(dump))
        assert (first.imported, first.skipped) == (3, 0) and set(first.renumbered) == {1, 2, 3}
        counts = _counts(target)
        second = import_jsonl(target, io.StringIO(dump))
        assert (second.imported, second.skipped, second.renumbered) == (0, 3, {})
        assert _counts(target) == counts
        moved = target.get(first.renumbered[1])
        assert moved["content"] == "Alice prefers tabs, width 4" and [h["content"] for h in moved["history"]] == ["Alice prefers tabs"]
        bob = target.get(first.renumbered[3])
        assert (bob["speaker"], bob["episode"], bob["occurred_at"][:10]) == ("Bob", "chat-1", "2023-05-08")
        assert_consistent(target)


def test_interrupted_import_resumes_without_duplicates(tmp_path):
    dump = _source(tmp_path)
    lines = dump.splitlines(keepends=True)
    with MemoryEngine(_config(tmp_path / "fresh.db"), embedder=HashEmbedder()) as target:
        partial = import_jsonl(target, io.StringIO("".join(lines[:-1])))  # the last memory never arrived
        assert partial.imported == 2
        rest = import_jsonl(target, io.StringIO(dump))
        assert (rest.imported, rest.skipped) == (1, 2)
        # Into a database that never used them, ids are kept.
        assert sorted(r[0] for r in target.store.read("SELECT id FROM memories")) == [1, 2, 3]
        assert_consistent(target)


def test_import_never_reuses_a_deleted_id(tmp_path):
    dump = _source(tmp_path)
    with MemoryEngine(_config(tmp_path / "target.db"), embedder=HashEmbedder()) as target:
        ids = target.save(["x one", "x two", "x three"])["ids"]
        for mid in ids:
            target.delete(mid)
        report = import_jsonl(target, io.StringIO(dump))
        assert report.renumbered == {1: 4, 2: 5, 3: 6}  # ids 1-3 were handed out before, to other memories
        assert np.all([target.get(i)["content"] for i in (4, 5, 6)])

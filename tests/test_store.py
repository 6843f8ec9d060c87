"""The SQLite file: pragmas, migrations from older schemas, newer-schema refusal, driver choice,
and the embedder identity recorded in the database (mismatch, reindex)."""

from __future__ import annotations

import json
import threading
import sqlite3

import numpy as np
import pytest

from conftest import HashEmbedder
from tinycontext import MemoryEngine, ModelMismatchError, StorageError, TinyContextConfig
from tinycontext.memory.engine import _content_hash
from tinycontext.memory.store import BUSY_TIMEOUT_MS, SCHEMA_VERSION, Store, now_iso
from tinycontext.models.embedder import Embedder
from tinycontext.models.hub import builtin_bundle


def pragma(store: Store, name: str):
    return store.read(f"PRAGMA {name}")[0][0]


def counts(engine: MemoryEngine) -> tuple[int, int, int, int]:
    read = engine.store.read
    return (read("SELECT count(*) FROM memories")[0][0], read("SELECT count(*) FROM memory_vectors")[0][0],
            read("SELECT count(*) FROM memories_fts")[0][0], read("SELECT count(*) FROM memory_tags")[0][0])


def test_pragmas(hash_engine):
    store = hash_engine.store
    assert pragma(store, "user_version") == SCHEMA_VERSION == store.schema_version
    assert pragma(store, "journal_mode") == "wal"
    assert pragma(store, "busy_timeout") == BUSY_TIMEOUT_MS > 0
    assert pragma(store, "foreign_keys") == 1
    assert pragma(store, "integrity_check") == "ok"


def test_write_rolls_back_on_error(hash_engine):
    hash_engine.save(["before"])
    with pytest.raises(RuntimeError):
        with hash_engine.store.write() as conn:
            conn.execute("DELETE FROM memories")
            raise RuntimeError("boom")
    assert [m["content"] for m in hash_engine.recall("before")["memories"]] == ["before"]


# -- migrations ---------------------------------------------------------------------------------

V1_ROWS = [
    ("work", "The deploy key rotates every 90 days.", ["security", "ops"], {"source": "wiki"}),
    ("work", "Standup is at 09:30 in room Ada.", ["meetings"], {}),
    ("home", "Water the ficus on Sundays.", [], {"plant": True}),
]


def build_v1(path) -> list[int]:
    """A database as TinyContext schema v1 left it: no versions, no tag index, no vectors table."""
    store = Store(path, target_version=1)
    assert store.schema_version == 1
    ids = []
    with store.write() as conn:
        for session, content, tags, meta in V1_ROWS:
            stamp = now_iso()
            conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (session, stamp))
            cur = conn.execute(
                "INSERT INTO memories(session_id, content, tags, metadata, content_hash, tokens, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session, content, json.dumps(tags), json.dumps(meta), _content_hash(content), len(content.split()), stamp))
            ids.append(cur.lastrowid)
    assert not store.read("SELECT 1 FROM sqlite_master WHERE name IN ('memory_tags', 'memory_versions', 'memory_vectors')")
    store.close()
    return ids


def test_migration_from_v1(config):
    ids = build_v1(config.memory_db_path)
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        assert eng.store.schema_version == SCHEMA_VERSION
        assert eng.reindexed == len(V1_ROWS)
        assert counts(eng) == (3, 3, 3, 3)
        for mid, (session, content, tags, meta) in zip(ids, V1_ROWS):
            memory = eng.get(mid)
            assert (memory["session_id"], memory["content"], memory["tags"], memory["metadata"]) == (session, content, tags, meta)
            assert memory["version"] == 1 and memory["updated_at"] == memory["created_at"] and memory["history"] == []
        assert {(r[0], r[1]) for r in eng.store.read("SELECT memory_id, tag FROM memory_tags")} == {
            (ids[0], "security"), (ids[0], "ops"), (ids[1], "meetings")}
        # Recall works on both sides, with tags and sessions.
        for weight in (0.0, 1.0):
            assert [m["id"] for m in eng.recall("deploy key rotates", dense_weight=weight, top_k=1)["memories"]] == [ids[0]]
        assert [m["id"] for m in eng.recall("standup deploy", tags=["meetings"])["memories"]] == [ids[1]]
        assert [m["id"] for m in eng.recall("ficus Sundays", session_id="home")["memories"]] == [ids[2]]
        # v1 hashes still catch duplicates; edits get history.
        assert eng.save(["Water the ficus  on Sundays."], session_id="home")["skipped"][0]["duplicate_of"] == ids[2]
        assert eng.update(ids[1], "Standup moved to 10:00.")["history"][0]["content"] == V1_ROWS[1][1]
        # v6: the session index that bounds BM25 to a session's id range.
        assert eng.store.read("SELECT 1 FROM sqlite_master WHERE name = 'memories_session_id'")
        assert eng.store.session_span("home") == (ids[2], ids[2]) and eng.store.session_span("nowhere") is None
    # Reopening does not migrate or re-embed again.
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        assert eng.reindexed == 0 and eng.store.schema_version == SCHEMA_VERSION and counts(eng)[:3] == (3, 3, 3)


def test_newer_schema_is_refused(config):
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        eng.save(["from the future"])
    raw = sqlite3.connect(config.memory_db_path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    before = config.memory_db_path.read_bytes()
    with pytest.raises(StorageError) as err:
        MemoryEngine(config, embedder=HashEmbedder())
    assert err.value.code == "storage_error" and "v99" in err.value.message and "Upgrade" in err.value.message
    assert config.memory_db_path.read_bytes() == before
    raw = sqlite3.connect(config.memory_db_path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 99
    assert raw.execute("SELECT content FROM memories").fetchall() == [("from the future",)]
    raw.close()


def _foreign(path, user_version: int, schema: str) -> bytes:
    raw = sqlite3.connect(path)
    raw.executescript(schema)
    raw.execute(f"PRAGMA user_version = {user_version}")
    raw.commit()
    raw.close()
    return path.read_bytes()


@pytest.mark.parametrize("user_version, schema, match", [
    (99, "CREATE TABLE photos(id INTEGER PRIMARY KEY, blob BLOB); INSERT INTO photos(blob) VALUES (x'00ff');", "v99, newer"),
    (0, "CREATE TABLE photos(id INTEGER PRIMARY KEY, blob BLOB); INSERT INTO photos(blob) VALUES (x'00ff');", "another application's"),
    (3, "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);", "another application's"),
    (0, "CREATE TABLE memories(id TEXT PRIMARY KEY, session_id TEXT, content TEXT, created_at TEXT);", "legacy TinyContext database"),
])
def test_a_foreign_or_newer_database_is_refused_byte_identical(config, user_version, schema, match):
    """Refused by a read-only look before the write connection exists: not even switched to WAL (issue 19)."""
    config.memory_db_path.parent.mkdir(parents=True, exist_ok=True)
    before = _foreign(config.memory_db_path, user_version, schema)
    with pytest.raises(StorageError, match=match) as err:
        MemoryEngine(config, embedder=HashEmbedder())
    assert "was not changed" in err.value.message
    assert config.memory_db_path.read_bytes() == before and before[18:20] == b"\x01\x01"  # rollback journal, not WAL (2, 2)
    assert sorted(p.name for p in config.memory_db_path.parent.iterdir()) == [config.memory_db_path.name]


def test_not_a_database_is_storage_error(config):
    config.memory_db_path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StorageError, match="memory_db_path"):
        MemoryEngine(config, embedder=HashEmbedder())
    assert config.memory_db_path.read_bytes() == b"this is not sqlite at all" * 100


# -- embedder identity --------------------------------------------------------------------------

def test_real_model_identity_recorded(engine, real_embedder):
    engine.save(["identity check"])
    stored = json.loads(engine.store.read("SELECT value FROM meta WHERE key = 'embedder'")[0][0])
    assert stored == real_embedder.identity == engine.stats()["embedder"]
    assert set(stored) >= {"model", "revision", "dimensions", "pooling", "query_prefix", "document_prefix"}
    assert stored["dimensions"] == 384 and stored["pooling"] == "mean" and stored["model"] and stored["revision"]
    vector = engine.store.read("SELECT embedding FROM memory_vectors")[0][0]
    assert len(vector) == 384 * 4


@pytest.mark.parametrize("other", [HashEmbedder(model="other-model"), HashEmbedder(dimensions=32)])
def test_model_mismatch_then_reindex(config, other):
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        ids = eng.save(["alpha memory about rivers", "beta memory about mountains", "gamma memory about oceans"])["ids"]
        before = counts(eng)
    with pytest.raises(ModelMismatchError) as err, MemoryEngine(config, embedder=other) as eng:
        eng.save(["delta memory about lakes"])
    assert err.value.code == "model_mismatch" and "reindex" in err.value.message
    assert err.value.details["stored"] == HashEmbedder().identity and err.value.details["configured"] == other.identity
    # Nothing lost: the original embedder still opens it and finds everything.
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        assert eng.reindexed == 0 and counts(eng) == before
        assert [m["id"] for m in eng.recall("rivers", dense_weight=1.0, top_k=1)["memories"]] == [ids[0]]
    with MemoryEngine(config.model_copy(update={"reindex": "auto"}), embedder=other) as eng:
        assert eng.reindexed == len(ids)
        assert counts(eng) == before
        assert eng.stats()["embedder"] == other.identity
        vectors = eng.store.read("SELECT memory_id, embedding FROM memory_vectors ORDER BY memory_id")
        assert [len(v) for _, v in vectors] == [other.dimensions * 4] * 3
        assert np.allclose(np.frombuffer(vectors[1][1], np.float32), other.embed_documents(["beta memory about mountains"])[0])
        assert [m["id"] for m in eng.recall("mountains", dense_weight=1.0, top_k=1)["memories"]] == [ids[1]]
        assert eng.save(["delta memory about deserts"])["ids"]


def test_reindex_embeds_what_save_embeds(tmp_path, real_embedder):
    """Reindex (and back-fill) embed a conversation turn's speaker, date and attachments, as save does."""
    turn = {"content": "I adopted a puppy", "speaker": "Caroline", "occurred_at": "2023-05-08", "attachments": ["a photo of a dog"]}

    def vector(engine):
        return np.frombuffer(engine.store.read("SELECT embedding FROM memory_vectors")[0][0], np.float32)

    def config(name, **update):
        return TinyContextConfig(memory_db_path=tmp_path / name, models_dir=tmp_path / "models", **update)

    with MemoryEngine(config("fresh.db"), embedder=real_embedder) as engine:
        engine.save([turn])
        fresh = vector(engine)
    for name, first in (("reindexed.db", {}), ("backfilled.db", {"embedding_backend": "none"})):
        with MemoryEngine(config(name, **first), embedder=HashEmbedder() if not first else None) as engine:
            engine.save([turn])
        with MemoryEngine(config(name, reindex="auto"), embedder=real_embedder) as engine:
            assert engine.reindexed == 1 and np.allclose(vector(engine), fresh, atol=1e-6), name


def test_a_database_keeps_its_document_graph_until_reindex(tmp_path):
    """With embedding_int8_documents on, a new database's documents are embedded on the int8 graph; one
    whose vectors came from the float32 graph (every database from before) is not re-embedded on open and
    keeps float32 for new saves, until `reindex` converts it; either way round. The embedder passed in is
    not changed (it may serve other databases)."""
    texts = ["Caroline adopted a puppy in May.", "Melanie painted a sunrise over the lake.", "The router password was reset."]
    float32 = Embedder(builtin_bundle(), cache_size=0, outlier_documents=False)
    int8 = Embedder(builtin_bundle(), cache_size=0, int8_documents=True)
    configured = Embedder(builtin_bundle(), int8_documents=True)
    config = TinyContextConfig(memory_db_path=tmp_path / "old.db", models_dir=tmp_path / "models")

    def vectors(engine):
        rows = engine.store.read("SELECT memory_id, embedding FROM memory_vectors ORDER BY memory_id")
        return np.stack([np.frombuffer(blob, np.float32) for _, blob in rows])

    with MemoryEngine(config, embedder=float32) as engine:
        engine.save(texts[:2])
    with MemoryEngine(config, embedder=configured) as engine:
        engine.save(texts[2:])
        assert engine.reindexed == 0 and engine.stats()["embedder"] == float32.identity
        assert np.array_equal(vectors(engine), float32.embed_documents(texts))
        assert engine.recall(texts[1], top_k=1)["memories"][0]["content"] == texts[1]
        assert configured.identity == int8.identity
        assert engine.reindex() == 3 and engine.stats()["embedder"] == int8.identity
        assert np.array_equal(vectors(engine), int8.embed_documents(texts))
        assert engine.recall(texts[1], top_k=1)["memories"][0]["content"] == texts[1]
    with MemoryEngine(config, embedder=float32) as engine:  # now an int8 database: followed, not re-embedded
        engine.save(["A fourth memory about the lake."])
        assert engine.reindexed == 0 and engine.stats()["embedder"] == int8.identity
        assert np.array_equal(vectors(engine)[-1], int8.embed_documents(["A fourth memory about the lake."])[0])
    for name, embedder in (("new-int8.db", configured), ("new-default.db", float32)):
        with MemoryEngine(config.model_copy(update={"memory_db_path": tmp_path / name}), embedder=embedder) as engine:
            engine.save(texts[:1])
            assert engine.stats()["embedder"] == embedder.identity
            assert np.array_equal(vectors(engine), embedder.embed_documents(texts[:1]))


def test_the_default_outlier_graph_keeps_older_databases_on_theirs(tmp_path):
    """New databases embed documents on the outlier graph by default; a database from before it (float32
    documents, no document_graph recorded) opens without re-embedding, recalls, saves on float32, and
    `reindex` converts it."""
    texts = ["Caroline adopted a puppy in May.", "Melanie painted a sunrise over the lake.", "The router password was reset."]
    float32 = Embedder(builtin_bundle(), cache_size=0, outlier_documents=False)
    default = Embedder(builtin_bundle(), cache_size=0)
    config = TinyContextConfig(memory_db_path=tmp_path / "old.db", models_dir=tmp_path / "models")

    def vectors(engine):
        rows = engine.store.read("SELECT memory_id, embedding FROM memory_vectors ORDER BY memory_id")
        return np.stack([np.frombuffer(blob, np.float32) for _, blob in rows])

    with MemoryEngine(config, embedder=float32) as engine:
        engine.save(texts[:2])
    with MemoryEngine(config, embedder=default) as engine:
        engine.save(texts[2:])
        assert engine.reindexed == 0 and engine.stats()["embedder"] == float32.identity
        assert "document_graph" not in engine.stats()["embedder"]
        assert np.array_equal(vectors(engine), float32.embed_documents(texts))
        assert engine.recall("puppy adoption", top_k=1)["memories"][0]["content"] == texts[0]
        assert engine.reindex() == 3 and engine.stats()["embedder"] == default.identity
        assert np.array_equal(vectors(engine), default.embed_documents(texts))
        assert not np.array_equal(vectors(engine), float32.embed_documents(texts))
        assert engine.recall("puppy adoption", top_k=1)["memories"][0]["content"] == texts[0]
    with MemoryEngine(config.model_copy(update={"memory_db_path": tmp_path / "new.db"}), embedder=default) as engine:
        engine.save(texts[:1])
        assert engine.stats()["embedder"]["document_graph"] == default.recipe("document") != ""


def test_empty_database_rebinds_without_complaint(config):
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        eng.delete(eng.save(["temporary"])["ids"][0])
    with MemoryEngine(config, embedder=HashEmbedder(dimensions=16, model="new")) as eng:
        assert eng.save(["works"])["ids"]
        assert eng.stats()["embedder"]["model"] == "new"


def test_concurrent_first_open_keeps_vectors(config):
    """Another process binding and saving between this one's reads and its write must not lose vectors."""
    build_v1(config.memory_db_path)
    other: list[MemoryEngine] = []

    def embed_all(texts):
        # Runs between bind_embedder's reads and its write: meanwhile a second engine opens and saves.
        eng = MemoryEngine(config, embedder=HashEmbedder())
        eng.save(["saved by the other process"])
        other.append(eng)
        return HashEmbedder().embed_documents(texts)

    store = Store(config.memory_db_path)
    assert store.bind_embedder(HashEmbedder().identity, reindex="error", embed_all=embed_all) == 0
    store.close()
    other[0].close()
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        assert counts(eng)[:3] == (4, 4, 4)
        assert eng.recall("saved by the other process", dense_weight=1.0, top_k=1)["memories"][0]["content"] == "saved by the other process"


def test_concurrent_reindex_embeds_memories_saved_meanwhile(config):
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        eng.save(["first memory"])
    new = HashEmbedder(model="new-model")

    calls: list[int] = []

    def embed_all(texts):
        calls.append(len(texts))
        if len(calls) == 1:  # the second call runs inside the write transaction
            with MemoryEngine(config, embedder=HashEmbedder()) as eng:
                eng.save(["second memory saved meanwhile"])
        return new.embed_documents(texts)

    store = Store(config.memory_db_path)
    assert store.bind_embedder(new.identity, reindex="auto", embed_all=embed_all) == 2
    store.close()
    assert calls == [1, 2]
    with MemoryEngine(config, embedder=new) as eng:
        assert counts(eng)[:3] == (2, 2, 2)


# -- driver -------------------------------------------------------------------------------------

def test_forced_stdlib_driver_without_extension_loading(config, monkeypatch):
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        pytest.skip("this Python's sqlite3 can load extensions")
    monkeypatch.setenv("TINYCONTEXT_SQLITE_DRIVER", "sqlite3")
    with pytest.raises(StorageError) as err:
        MemoryEngine(config, embedder=HashEmbedder())
    assert "enable_load_extension" in err.value.message and "TINYCONTEXT_SQLITE_DRIVER" in err.value.message
    assert not config.memory_db_path.exists()


def test_forced_sqlean_driver(config, monkeypatch):
    monkeypatch.setenv("TINYCONTEXT_SQLITE_DRIVER", "sqlean")
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        assert eng.store.driver.__name__.startswith("sqlean") and "forced" in eng.store.driver_reason
        assert eng.save(["through sqlean"])["ids"]


def test_reads_do_not_wait_for_a_write(config):
    """Pooled read connections (WAL): BM25 recall runs while another thread holds a write transaction
    and sees the last committed state; reads inside the transaction see its own changes. (Dense search
    reads the in-RAM copy, which follows the write: it waits for the commit.)"""
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        first = eng.save(["the boiler is serviced in May"], session_id="s")["ids"][0]
        holding, done = threading.Event(), threading.Event()
        found: list = []

        def reader():
            holding.wait(10)
            found.append([m["id"] for m in eng.recall("boiler serviced", session_id="s", dense_weight=0.0)["memories"]])
            done.set()

        thread = threading.Thread(target=reader)
        thread.start()
        with eng.store.write() as conn:
            conn.execute("UPDATE memories SET tokens = 99 WHERE id = ?", (first,))
            assert eng.store.read("SELECT tokens FROM memories WHERE id = ?", (first,)) == [(99,)]  # own change, same connection
            holding.set()
            assert done.wait(20), "a read waited for the write transaction"
            assert found == [[first]]
        thread.join()
        assert eng.store.read("SELECT tokens FROM memories WHERE id = ?", (first,)) == [(99,)]
    with MemoryEngine(config.model_copy(update={"read_connections": 0}), embedder=HashEmbedder()) as eng:
        assert eng.store.read("SELECT count(*) FROM memories") == [(1,)] and not eng.store._readers


def test_bulk_writes_get_the_write_cache(config, monkeypatch):
    """Imports write with the write connection's page cache at write_cache_mib (their dirty pages stay in it rather than
    spilling to the WAL mid-transaction), then it is SQLite's default again, so reads through that connection (the
    vector index's loads) do not fill it for good; saves and the pooled readers keep the default; an import larger
    than a small cache still lands whole."""
    for mib in (2, 64):
        cfg = config.model_copy(update={"write_cache_mib": mib, "memory_db_path": config.memory_db_path.with_name(f"cache{mib}.db")})
        with MemoryEngine(cfg, embedder=HashEmbedder()) as eng:
            size = lambda: eng.store.conn.execute("PRAGMA cache_size").fetchone()[0]  # noqa: E731
            seen, write = [], eng._write
            monkeypatch.setattr(eng, "_write", lambda *a, **k: (seen.append(size()), write(*a, **k))[1])
            assert size() == -2000 and pragma(eng.store, "cache_size") == -2000  # a pooled reader
            with eng.index.write():  # one transaction of three batches, as a file import writes them
                for start in (0, 1000, 2000):
                    eng.import_memories([{"content": f"note {i} " + "word " * 200} for i in range(start, start + 1000)], session_id="s")
            eng.save(["a small save"], session_id="s")
            assert seen == [-mib * 1024] * 3 + [-2000] and size() == -2000
            assert eng.store.read("SELECT count(*), count(DISTINCT content) FROM memories") == [(3001, 3001)]
            assert eng.store.read("SELECT count(*) FROM memory_vectors") == [(3001,)]


def fts_segments_written(store: Store) -> int:
    """The FTS5 structure record's write counter: segments written since the index was created (a 4-byte cookie,
    then varints: levels, segments, write counter; fts5_index.c)."""
    block, pos, values = store.read("SELECT block FROM memories_fts_data WHERE id = 10")[0][0], 4, []
    while len(values) < 3:
        value = 0
        while True:
            byte, pos = block[pos], pos + 1
            value = value << 7 | byte & 0x7F
            if byte < 0x80:
                break
        values.append(value)
    return values[2]


def test_a_save_writes_one_full_text_segment(hash_engine):
    """The memories of one call reach the full-text index in one statement: FTS5 writes its pending terms out at every
    statement that reaches it through the trigger, and row-by-row inserts wrote (and merged) one segment per memory.
    The rows stored are what was saved."""
    contents = [f"memory {i} about topic {i % 7} and word{i}" for i in range(40)]
    ids = hash_engine.save([{"content": c, "tags": [f"t{i % 3}"], "speaker": "Ann" if i % 2 else None} for i, c in enumerate(contents)],
                           session_id="s")["ids"]
    assert fts_segments_written(hash_engine.store) == 1
    hash_engine.save(["one more"], session_id="s")
    assert fts_segments_written(hash_engine.store) == 2
    rows = hash_engine.store.read("SELECT id, content, tags, speaker FROM memories ORDER BY id")
    assert rows[:40] == [(i, c, json.dumps([f"t{n % 3}"]), "Ann" if n % 2 else None) for n, (i, c) in enumerate(zip(ids, contents))]
    assert [m["id"] for m in hash_engine.recall("word17 topic", session_id="s", dense_weight=0.0)["memories"]][:1] == [ids[17]]

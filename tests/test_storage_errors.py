"""Every SQLite failure is a typed storage_error that says what to do, caused for real: a file of
garbage, a damaged page, a full database (max_page_count), a read-only connection, a lock held past
the timeout. A failed write leaves nothing behind."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from conftest import HashEmbedder
from consistency import assert_consistent

from tinycontext import MemoryEngine, StorageError, TinyContextConfig
from tinycontext.cli.commands import main
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background


def _counts(engine) -> tuple:
    read = engine.store.read
    return tuple(read(f"SELECT count(*) FROM {t}")[0][0] for t in ("memories", "memory_vectors", "memory_tags", "memory_versions"))


def test_garbage_file_is_storage_error(config, env, capsys):
    config.memory_db_path.parent.mkdir(parents=True, exist_ok=True)
    config.memory_db_path.write_bytes(os.urandom(8192))
    with pytest.raises(StorageError, match="not a TinyContext database|new file"):
        MemoryEngine(config, embedder=HashEmbedder())
    # The CLI says the same, without a traceback.
    open(env["TINYCONTEXT_MEMORY_DB_PATH"], "wb").write(os.urandom(8192))
    assert main(["stats"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("storage_error: ") and "Traceback" not in err


def test_damaged_page_after_open_is_storage_error(config):
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        engine.save([f"memory number {i} " + "filler " * 200 for i in range(40)])
    data = bytearray(config.memory_db_path.read_bytes())
    page = 4096
    for start in range(page * 3, len(data) - page, page * 2):  # trash every other page after the schema
        data[start + 100:start + page] = os.urandom(page - 100)
    config.memory_db_path.write_bytes(bytes(data))
    with pytest.raises(StorageError) as caught:
        with MemoryEngine(config, embedder=HashEmbedder()) as engine:
            engine.recall("memory number 7 filler", top_k=50)
            engine.stats()
            engine.store.read("PRAGMA quick_check")
            for mid in range(1, 41):
                engine.get(mid)
    assert caught.value.code == "storage_error" and ("damaged" in caught.value.message or "doctor" in caught.value.message)


def test_full_database_writes_nothing(hash_engine):
    hash_engine.save(["A small memory that fits."], session_id="s")
    before = _counts(hash_engine)
    pages = hash_engine.store.read("PRAGMA page_count")[0][0]
    hash_engine.store.conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StorageError, match="full") as caught:
        hash_engine.save([{"content": f"big memory {i} " + "x" * 40_000, "tags": ["t"]} for i in range(5)], session_id="s")
    assert "free disk space" in caught.value.message and "Nothing from this call was saved" in caught.value.message
    assert _counts(hash_engine) == before
    hash_engine.store.conn.execute(f"PRAGMA max_page_count = {10 * pages + 1_000_000}")
    assert hash_engine.save(["Room again."], session_id="s")["ids"]
    assert_consistent(hash_engine)


def test_read_only_database_is_storage_error(hash_engine, config):
    mid = hash_engine.save(["Written before the database became read-only."])["ids"][0]
    hash_engine.store.conn.execute("PRAGMA query_only = ON")  # SQLITE_READONLY, as root gets from a read-only mount
    before = _counts(hash_engine)
    for attempt in (lambda: hash_engine.save(["new"]), lambda: hash_engine.update(mid, "changed"), lambda: hash_engine.delete(mid)):
        with pytest.raises(StorageError, match="read-only"):
            attempt()
    assert _counts(hash_engine) == before and hash_engine.get(mid)["content"].startswith("Written before")
    hash_engine.store.conn.execute("PRAGMA query_only = OFF")
    # A read-only URI connection (root ignores file modes, a mode=ro open does not).
    ro = hash_engine.store.driver.connect(f"file:{config.memory_db_path}?mode=ro", uri=True)
    try:
        with pytest.raises(hash_engine.store.driver.OperationalError) as raw:
            ro.execute("DELETE FROM sessions")
        from tinycontext.memory.store import storage_error

        assert "read-only" in storage_error(raw.value, config.memory_db_path).message
    finally:
        ro.close()


def test_lock_held_past_the_timeout_is_storage_error(hash_engine, config):
    hash_engine.save(["Before the lock."])
    before = _counts(hash_engine)
    other = hash_engine.store.driver.connect(str(config.memory_db_path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    hash_engine.store.read("PRAGMA busy_timeout = 200")
    try:
        with pytest.raises(StorageError, match="retry"):
            hash_engine.save(["While locked."])
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _counts(hash_engine) == before
    assert hash_engine.save(["After the lock."])["ids"]


def test_storage_error_over_rest_is_503(hash_engine):
    hash_engine.save(["Fine so far."])
    hash_engine.store.conn.execute("PRAGMA query_only = ON")
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        response = httpx.post(base + "/save_memories", json={"memories": [{"content": "refused"}]})
    assert (response.status_code, response.json()["code"]) == (503, "storage_error")
    assert "read-only" in json.dumps(response.json())

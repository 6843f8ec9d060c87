"""A full disk (simulated with SQLite's max_page_count, which fails writes the same way) is a typed
storage_error, nothing already stored is lost, and the next write works once there is room again."""

from __future__ import annotations

import pytest

from tinycontext.errors import StorageError


def test_full_database_is_a_typed_error_and_recovers(hash_engine):
    store = hash_engine.store
    kept = hash_engine.save([f"kept memory {i}" for i in range(5)])["ids"]
    pages = store.read("PRAGMA page_count")[0][0]
    store.conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(StorageError, match="database or disk is full") as caught:
        for i in range(1000):
            hash_engine.save(f"filler {i} " + "x" * 20_000)
    assert caught.value.code == "storage_error" and "Nothing from this call was saved" in caught.value.message
    assert not store.conn.in_transaction
    assert [hash_engine.get(i)["content"] for i in kept] == [f"kept memory {i}" for i in range(5)]
    store.conn.execute("PRAGMA max_page_count = 1073741823")
    new_id = hash_engine.save("room again")["ids"][0]
    assert hash_engine.get(new_id)["content"] == "room again" and new_id > max(kept)


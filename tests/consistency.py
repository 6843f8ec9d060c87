"""The one check that a database's rows, FTS index, tags and vectors agree (race, concurrency and fault tests)."""

from __future__ import annotations

import json

import numpy as np

from tinycontext.retrieval.conversation import EMBEDDING_COLUMNS, stored_embedding_text


def assert_consistent(engine) -> dict[int, str]:
    """Every memory's FTS entry, tag rows and vector agree with its text; returns {id: content}.

    The vector is recomputed with the engine's embedder and compared, so a vector left over from an
    earlier text fails. FTS5's integrity-check with rank=1 compares the index with the table."""
    read = engine.store.read
    # Both checks on the write connection: a pooled reader that has not read since other connections
    # wrote can report FTS5 "malformed inverted index" from its cached index structure once (its
    # searches are right, and the next check says ok), which would make this check flaky, not stricter.
    with engine.store.lock:
        assert engine.store.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        engine.store.conn.execute("INSERT INTO memories_fts(memories_fts, rank) VALUES ('integrity-check', 1)")  # a command: not on a read-only connection
    rows = read(f"SELECT id, session_id, tags, {EMBEDDING_COLUMNS} FROM memories ORDER BY id")
    texts = [stored_embedding_text(*r[3:]) for r in rows]
    contents = {r[0]: r[3] for r in rows}
    vectors = {mid: np.frombuffer(blob, dtype=np.float32) for mid, blob in read("SELECT memory_id, embedding FROM memory_vectors")}
    assert set(vectors) == set(contents), "a memory without a vector, or a vector without a memory"
    if rows:
        expected = engine.embedder.embed_documents(texts)
        for r, text, want in zip(rows, texts, expected):
            assert np.allclose(vectors[r[0]], want, atol=1e-5), f"memory {r[0]}'s vector does not embed its text {text!r}"
    tag_rows: dict[int, set] = {}
    for mid, tag in read("SELECT memory_id, tag FROM memory_tags"):
        tag_rows.setdefault(mid, set()).add(tag)
    for r in rows:
        assert tag_rows.get(r[0], set()) == set(json.loads(r[2])), f"memory {r[0]}'s tag index disagrees with its tags"
    # The in-memory vector cache answers like the table: a memory's own text finds the best score the
    # table gives that query in its session (the query's vector may be computed on another graph than the
    # documents', embedding_int8_queries, so the score is near 1, not 1).
    session_of = {r[0]: r[1] for r in rows}
    for r, text in zip(rows, texts):
        query = engine.embedder.embed_query(text)
        best = max(float(query @ vectors[mid]) for mid, session in session_of.items() if session == r[1])
        top = engine.recall(text, session_id=r[1], dense_weight=1.0, top_k=1, max_tokens=1_000_000, include_superseded=True)["memories"]
        assert top and np.isclose(top[0]["scores"]["dense"], best, atol=1e-4), f"dense search does not find memory {r[0]} by its own text"
    return contents

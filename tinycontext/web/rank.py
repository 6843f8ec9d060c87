"""Ranking passages against a query with the engine's hybrid search, in memory.

The same pieces as recall: an FTS5 table with the memory table's tokenizer and BM25 weights, the
query built by :func:`tinycontext.retrieval.fts_query`, cosine similarity of the configured
embedder's vectors, fused by :func:`tinycontext.retrieval.fuse` with the configured dense weight
and RRF k. Nothing touches the memory database.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..config import TinyContextConfig
from ..retrieval import fts_query, fuse
from ..store import sqlite_driver


def bm25_ranking(query: str, texts: Sequence[str]) -> list[tuple[int, float]]:
    """(position, score) of the texts that match ``query``, best first (FTS5 bm25)."""
    match = fts_query(query)
    if match is None or not texts:
        return []
    driver, _ = sqlite_driver()
    conn = driver.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE passages USING fts5(content, tokenize='porter unicode61 remove_diacritics 2')")
        conn.executemany("INSERT INTO passages(rowid, content) VALUES (?, ?)", [(i + 1, t) for i, t in enumerate(texts)])
        rows = conn.execute("SELECT rowid, -bm25(passages) AS score FROM passages WHERE passages MATCH ? "
                            "ORDER BY score DESC, rowid", (match,)).fetchall()
    finally:
        conn.close()
    return [(rowid - 1, score) for rowid, score in rows]


def dense_ranking(query_vector: np.ndarray, vectors: np.ndarray) -> list[tuple[int, float]]:
    if len(vectors) == 0:
        return []
    scores = vectors @ query_vector
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return [(i, float(scores[i])) for i in order]


def rank_passages(query: str, texts: Sequence[str], embedder, config: TinyContextConfig) -> list[tuple[int, float]]:
    """(position, fused score) of every passage, best first, as recall would rank them (BM25 alone
    without an embedder)."""
    weight = config.recall_dense_weight if embedder is not None else 0.0
    bm25 = bm25_ranking(query, texts) if weight < 1.0 else []
    dense = []
    if weight > 0.0 and texts:
        vectors = np.asarray(embedder.embed_documents(list(texts)), dtype=np.float32)
        dense = dense_ranking(np.asarray(embedder.embed_query(query), dtype=np.float32), vectors)
    return [(c.id, c.rrf) for c in fuse(bm25, dense, dense_weight=weight, k=config.recall_rrf_k)]


def boost_neighbours(order: Sequence[tuple[int, float]], sections: Sequence, weight: float) -> list[tuple[int, float]]:
    """Re-rank fused ``(position, score)`` pairs: each passage gains ``weight`` times the better score of
    the passages right before and after it in the same section (``sections[position]``), so evidence that
    runs over two passages (a long paragraph, a reply and its answer) comes through together."""
    if weight <= 0.0:
        return list(order)
    score = dict(order)
    boosted = []
    for position, own in order:
        near = [score.get(n, 0.0) for n in (position - 1, position + 1)
                if 0 <= n < len(sections) and sections[n] == sections[position]]
        boosted.append((position, own + weight * max(near, default=0.0)))
    return sorted(boosted, key=lambda pair: (-pair[1], pair[0]))

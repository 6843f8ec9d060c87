"""Ranking passages against a query with the engine's hybrid search, in memory.

The same pieces as recall: an FTS5 table with the memory table's tokenizer and BM25 weights, the
query built by :func:`tinycontext.retrieval.fusion.fts_query`, cosine similarity of the configured
embedder's vectors, fused by :func:`tinycontext.retrieval.fusion.fuse` with the configured dense weight
and RRF k. Nothing touches the memory database. A passage is scored twice: as a whole, and by its
best unit (paragraph or sentence, read with its heading path), so the one sentence that answers
counts even in a passage about something else, and a sentence whose topic is only in its heading
("## Bridges" ... "The stone ones date from Roman times") is read with that topic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..config import TinyContextConfig
from ..retrieval.fusion import fts_query, fuse
from ..sqlite import sqlite_driver

if TYPE_CHECKING:
    from .chunk import Chunk


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


def rank_passages(query: str, texts: Sequence[str], embedder, config: TinyContextConfig,
                  embed: Sequence[int] | None = None) -> list[tuple[int, float]]:
    """(position, fused score) of every passage, best first, as recall would rank them (BM25 alone
    without an embedder). ``embed``: the positions whose texts are embedded (default: all); the
    others are ranked by BM25 alone."""
    weight = config.recall_dense_weight if embedder is not None else 0.0
    bm25 = bm25_ranking(query, texts) if weight < 1.0 else []
    dense = []
    positions = range(len(texts)) if embed is None else list(embed)
    if weight > 0.0 and positions:
        vectors = np.asarray(embedder.embed_documents([texts[i] for i in positions]), dtype=np.float32)
        query_vector = np.asarray(embedder.embed_query(query), dtype=np.float32)
        dense = [(positions[j], score) for j, score in dense_ranking(query_vector, vectors)]
    return [(c.id, c.rrf) for c in fuse(bm25, dense, dense_weight=weight, k=config.recall_rrf_k)]


def passages_of(chunks: Sequence[Chunk]) -> tuple[list[int], list[str], list[tuple[str, ...]]]:
    """The passages the chunks belong to, in page order: their ids, texts (the chunks joined by blank
    lines) and heading paths."""
    members: dict[int, list[Chunk]] = {}
    for c in chunks:
        members.setdefault(c.passage, []).append(c)
    ids = list(members)
    return ids, ["\n\n".join(c.text for c in members[p]) for p in ids], [members[p][0].heading_path for p in ids]


def rank_chunks(query: str, chunks: Sequence[Chunk], embedder, config: TinyContextConfig) -> list[tuple[int, float]]:
    """(position, score) of the chunks (the page's units), best first: the fused score of its passage (after
    the neighbour boost) plus ``scrape_unit_weight`` times the fused score of its best unit among all the
    page's units.

    Units are ranked page-wide by BM25, but only those of the ``scrape_unit_candidates`` best passages
    are embedded: a passage far down the page's order is rarely lifted into what fits, and embedding every
    unit of a long page costs more than its passages."""
    if not chunks:
        return []
    ids, texts, sections = passages_of(chunks)
    passages = boost_neighbours(rank_passages(query, texts, embedder, config), sections, config.scrape_neighbour_weight)
    context = {ids[k]: score for k, score in passages}
    best: dict[int, float] = {}
    if config.scrape_unit_weight > 0.0:
        candidates = {ids[k] for k, _ in passages[:config.scrape_unit_candidates]}
        owners = [i for i, c in enumerate(chunks) for _ in c.units]
        unit_texts = [" > ".join(c.heading_path) + "\n" + c.text[s - c.start:e - c.start] if c.heading_path
                      else c.text[s - c.start:e - c.start] for c in chunks for s, e in c.units]
        embed = [u for u, owner in enumerate(owners) if chunks[owner].passage in candidates]
        for unit, unit_score in rank_passages(query, unit_texts, embedder, config, embed=embed):
            best[owners[unit]] = max(best.get(owners[unit], 0.0), unit_score)
    score = {i: context.get(c.passage, 0.0) + config.scrape_unit_weight * best.get(i, 0.0) for i, c in enumerate(chunks)}
    return sorted(score.items(), key=lambda pair: (-pair[1], pair[0]))


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

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

import itertools
import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..config import TinyContextConfig
from ..retrieval.fusion import fts_query, fuse
from ..sqlite import sqlite_driver
from .deadline import Deadline

if TYPE_CHECKING:
    from .chunk import Chunk

# Texts per call to the embedder: the deadline is checked between calls (the embedder's own batches run in
# parallel inside one).
EMBED_SLICE = 64
# Passages embedded per passage the item's share of the budget holds (at least scrape_unit_candidates): a
# passage BM25 ranks low reaches a large budget by its vector only if it was embedded (LoCoMo dev at 2,000
# tokens: .863 with 24 candidates, .907 with 48; notes/web_evidence.md). From LARGE_BUDGET tokens on, twice
# as many: long pages hold more distractors than the second thousand tokens' candidates cover, while small
# budgets keep their embedding cost (the cold-latency bound is set at 500).
CANDIDATES_PER_FIT = 4
LARGE_BUDGET = 1000
LARGE_BUDGET_CANDIDATES_PER_FIT = 8


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
                  deadline: Deadline | None = None) -> list[tuple[int, float]]:
    """(position, fused score) of every passage, best first, as recall would rank them (BM25 alone
    without an embedder; texts not embedded by the ``deadline``'s soft limit by BM25 alone too)."""
    weight = config.recall_dense_weight if embedder is not None else 0.0
    dense = []
    if weight > 0.0 and texts:
        query_vector = np.asarray(embedder.embed_query(query), dtype=np.float32)
        dense = dense_ranking(query_vector, embed_until(embedder, texts, deadline))
    return _fused(bm25_ranking(query, texts), dense, weight, config)


def embed_until(embedder, texts: Sequence[str], deadline: Deadline | None) -> np.ndarray:
    """Vectors of the first texts, embedded in slices while the next slice, taking as long as the last one,
    ends before the deadline's soft limit: all of them unless a page's ranking would outrun its item's
    time (then ``deadline.cut`` is set)."""
    done = []
    last = 0.0
    for begin in range(0, len(texts), EMBED_SLICE):
        started = time.monotonic()
        if deadline is not None and deadline.soft_passed(after=last):
            deadline.cut = True
            break
        done.append(np.asarray(embedder.embed_documents(list(texts[begin:begin + EMBED_SLICE])), dtype=np.float32))
        last = time.monotonic() - started
    return np.concatenate(done) if done else np.zeros((0, 1), dtype=np.float32)


def passages_of(chunks: Sequence[Chunk]) -> tuple[list[int], list[str], list[tuple[str, ...]]]:
    """The passages the chunks belong to, in page order: their ids, texts (the chunks joined by blank
    lines) and heading paths."""
    members: dict[int, list[Chunk]] = {}
    for c in chunks:
        members.setdefault(c.passage, []).append(c)
    ids = list(members)
    return ids, ["\n\n".join(c.text for c in members[p]) for p in ids], [members[p][0].heading_path for p in ids]


def _fused(bm25: list[tuple[int, float]], dense: list[tuple[int, float]], weight: float,
           config: TinyContextConfig) -> list[tuple[int, float]]:
    return [(c.id, c.rrf) for c in fuse(bm25, dense, dense_weight=weight, k=config.recall_rrf_k)]


def candidate_passages(bm25_passages: Sequence[tuple[int, float]], unit_passages: Sequence[int],
                       sections: Sequence, n: int) -> list[int]:
    """The ``n`` passages (positions) whose units are embedded: those BM25 ranks best as passages and as
    the owners of the best units, taken in turn; then their same-section neighbours (the neighbour boost
    reads them), then the page's first passages (a query no word of which is on the page)."""
    picked: dict[int, None] = {}
    for pair in itertools.zip_longest([k for k, _ in bm25_passages], unit_passages):
        for k in pair:
            if k is not None and len(picked) < n:
                picked.setdefault(k)
    for k in list(picked):
        for near in (k - 1, k + 1):
            if len(picked) < n and 0 <= near < len(sections) and sections[near] == sections[k]:
                picked.setdefault(near)
    for k in range(len(sections)):
        if len(picked) >= n:
            break
        picked.setdefault(k)
    return list(picked)


def within_units(passages: Sequence[int], units: Counter, limit: int) -> set[int]:
    """The passages, in their order, whose units together number at most ``limit`` (one too large for
    what is left is passed over): what embedding a page costs is bounded, however long the page."""
    kept: set[int] = set()
    room = limit
    for k in passages:
        if units[k] <= room:
            kept.add(k)
            room -= units[k]
    return kept


def rank_chunks(query: str, chunks: Sequence[Chunk], embedder, config: TinyContextConfig,
                deadline: Deadline | None = None, budget: int | None = None, pages: int = 1) -> list[tuple[int, float]]:
    """(position, score) of the chunks (the page's units), best first: the fused score of its passage (after
    the neighbour boost) plus ``scrape_unit_weight`` times the fused score of its best unit among all the
    page's units.

    Every passage and unit is ranked by BM25 (cheap); only the units of the passages chosen by BM25
    (:func:`candidate_passages`: an equal share of ``scrape_unit_candidates`` among the call's ``pages``, or
    CANDIDATES_PER_FIT (LARGE_BUDGET_CANDIDATES_PER_FIT from LARGE_BUDGET tokens) per passage that the item's
    ``budget`` holds when that is more; at most
    ``scrape_max_chunks`` units in all) are embedded, and a passage's vector is the mean of its units' (a page
    new to the embedder costs a fraction of its text, not twice it). The others keep their BM25 share of the
    fused scores. Embedding stops at the ``deadline``'s soft limit: what was embedded by then is used."""
    if not chunks:
        return []
    ids, texts, sections = passages_of(chunks)
    where = {p: k for k, p in enumerate(ids)}
    owners = [i for i, c in enumerate(chunks) for _ in c.units]
    unit_passage = [where[chunks[i].passage] for i in owners]
    unit_texts = [" > ".join(c.heading_path) + "\n" + c.text[s - c.start:e - c.start] if c.heading_path
                  else c.text[s - c.start:e - c.start] for c in chunks for s, e in c.units]
    weight = config.recall_dense_weight if embedder is not None else 0.0
    bm25_passages = bm25_ranking(query, texts)
    bm25_units = bm25_ranking(query, unit_texts)
    dense_passages: list[tuple[int, float]] = []
    dense_units: list[tuple[int, float]] = []
    if weight > 0.0:
        # The pages of one call share its candidates as they share its budget: five pages cost about one.
        depth = math.ceil(config.scrape_unit_candidates / max(1, pages))
        if budget is not None:
            per_fit = LARGE_BUDGET_CANDIDATES_PER_FIT if budget >= LARGE_BUDGET else CANDIDATES_PER_FIT
            depth = max(depth, math.ceil(per_fit * budget / config.scrape_passage_tokens))
        counts = Counter(unit_passage)
        chosen = within_units(candidate_passages(bm25_passages, [unit_passage[u] for u, _ in bm25_units], sections, depth),
                              counts, config.scrape_max_chunks)
        embed = [u for u, k in enumerate(unit_passage) if k in chosen]
        query_vector = np.asarray(embedder.embed_query(query), dtype=np.float32)
        vectors = embed_until(embedder, [unit_texts[u] for u in embed], deadline)
        embed = embed[:len(vectors)]
        if embed:
            dense_units = [(embed[j], score) for j, score in dense_ranking(query_vector, vectors)]
            members: dict[int, list[int]] = {}
            for j, u in enumerate(embed):
                members.setdefault(unit_passage[u], []).append(j)
            whole = [k for k, rows in members.items() if len(rows) == counts[k]]  # a passage cut by the clock has none
            if whole:
                means = np.stack([vectors[members[k]].mean(axis=0) for k in whole])
                means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
                dense_passages = [(whole[j], score) for j, score in dense_ranking(query_vector, means)]
    passages = boost_neighbours(_fused(bm25_passages, dense_passages, weight, config), sections,
                                config.scrape_neighbour_weight)
    context = {ids[k]: score for k, score in passages}
    best: dict[int, float] = {}
    if config.scrape_unit_weight > 0.0:
        for unit, unit_score in _fused(bm25_units, dense_units, weight, config):
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

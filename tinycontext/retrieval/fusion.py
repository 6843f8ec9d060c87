"""Query building and rank fusion: pure functions, no I/O."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

MAX_QUERY_TERMS = 64
_WORD = re.compile(r"\w+", re.UNICODE)
# Function words in an OR query match nearly every memory: they add noise to BM25 and make FTS5
# score every row; leaving them out is better and faster (notes/design_figures.md).
STOPWORDS = frozenset("""a an and are as at be been being but by can could did do does doing for from had has have
having he her hers him his how i if in into is it its me my of on or our she so than that the their them then there
these they this those to too was we were what when where which who whom why will with would you your yours""".split())


def fts_query(text: str) -> str | None:
    """A safe FTS5 MATCH expression: the query's words, each quoted, joined by OR.

    Quoting makes every word a plain string, so user text with FTS syntax (AND, NEAR, *, ^, :,
    quotes, parentheses) is searched for, never interpreted. English stopwords are left out unless
    the query has nothing else. Returns None when no word is left.
    """
    return match_expression(query_terms(text))


def match_expression(terms: list[str]) -> str | None:
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


def expression_terms(expression: str | None) -> list[str]:
    """The terms of a :func:`match_expression` (terms are words, which hold no double quote)."""
    return re.findall(r'"([^"]*)"', expression or "")


def query_terms(text: str) -> list[str]:
    """The words :func:`fts_query` searches for, in query order."""
    words = _WORD.findall(text.replace("\x00", " "))
    content_words = [w for w in words if w.lower() not in STOPWORDS]
    terms: list[str] = []
    seen: set[str] = set()
    for word in content_words or words:
        term = word.replace("_", " ").strip()
        if term and term.lower() not in seen:
            seen.add(term.lower())
            terms.append(term)
        if len(terms) >= MAX_QUERY_TERMS:
            break
    return terms


@dataclass(frozen=True)
class Signals:
    """What one query's searches found, before fusion (``MemoryEngine.search``): BM25 and dense hits,
    (id, score) best first, each ``depth`` deep; None for a list not searched. A recall given them
    (``signals=``) fuses them instead of searching, so settings that only change fusion, floor, cliff
    and budget can be tried on one search. A snapshot: valid while the store is unchanged."""

    query: str
    session_id: str | None
    tags: tuple[str, ...]
    filters: object  # a tinycontext.retrieval.filters.Filters
    depth: int
    bm25: tuple[tuple[int, float], ...] | None
    dense: tuple[tuple[int, float], ...] | None

    def to_dict(self) -> dict:
        """JSON-ready, e.g. to keep searches on disk; :meth:`from_dict` restores an equal object."""
        return {"query": self.query, "session_id": self.session_id, "tags": list(self.tags), "filters": self.filters.to_dict(),
                "depth": self.depth, "bm25": None if self.bm25 is None else [list(h) for h in self.bm25],
                "dense": None if self.dense is None else [list(h) for h in self.dense]}

    @classmethod
    def from_dict(cls, data: dict) -> "Signals":
        from .filters import parse_filters

        def hits(found):
            return None if found is None else tuple((int(i), float(score)) for i, score in found)

        return cls(data["query"], data["session_id"], tuple(data["tags"]), parse_filters(data["filters"]), int(data["depth"]),
                   hits(data["bm25"]), hits(data["dense"]))


# score_fusion's dense share, chosen on SciFact train (0.2-0.5 tried; notes/locomo.md).
SCORE_FUSION_DENSE_SHARE = 0.35


@dataclass
class Candidate:
    id: int
    bm25_rank: int | None = None
    dense_rank: int | None = None
    bm25: float | None = None
    dense: float | None = None
    rrf: float = 0.0
    extra: dict = field(default_factory=dict)


def fuse(bm25_hits: list[tuple[int, float]], dense_hits: list[tuple[int, float]], *, dense_weight: float, k: float) -> list[Candidate]:
    """Weighted reciprocal rank fusion: (1-w)/(k+rank_bm25) + w/(k+rank_dense), ranks from 1.

    Hits are (id, score) best first. Ties break toward the better single-list rank, then id, so
    the order is deterministic. With w=0 the order is BM25's, with w=1 it is dense's.
    """
    by_id: dict[int, Candidate] = {}
    for rank, (mid, score) in enumerate(bm25_hits, start=1):
        cand = by_id.setdefault(mid, Candidate(mid))
        cand.bm25_rank, cand.bm25 = rank, score
        cand.rrf += (1.0 - dense_weight) / (k + rank)
    for rank, (mid, score) in enumerate(dense_hits, start=1):
        cand = by_id.setdefault(mid, Candidate(mid))
        cand.dense_rank, cand.dense = rank, score
        cand.rrf += dense_weight / (k + rank)
    primary = "dense_rank" if dense_weight > 0.5 else "bm25_rank"
    secondary = "bm25_rank" if primary == "dense_rank" else "dense_rank"

    def key(c: Candidate):
        first = getattr(c, primary) or 10**9
        second = getattr(c, secondary) or 10**9
        return (-c.rrf, first, second, c.id)

    ranked = sorted(by_id.values(), key=key)
    # A list with zero weight contributes nothing; drop what only it found.
    if dense_weight == 0.0:
        ranked = [c for c in ranked if c.bm25_rank is not None]
    elif dense_weight == 1.0:
        ranked = [c for c in ranked if c.dense_rank is not None]
    return ranked


def score_fusion(ranked: list[Candidate], dense_hits: Sequence[tuple[int, float]], *, dense_share: float = SCORE_FUSION_DENSE_SHARE) -> list[Candidate]:
    """Fused candidates re-scored by their scores rather than their ranks, best first:
    ``rrf = (1 - dense_share) * bm25 / best bm25 + dense_share * (dense - last) / (best - last)``, where
    best and last are the dense list's first and last hits (``dense_hits``, best first), so both
    terms are in [0, 1]; a score a candidate lacks counts 0. Ties keep the fused order. Scores say how
    far apart two documents are, which ranks do not (SciFact train, notes/locomo.md "Long documents").
    Needs both lists: otherwise ``ranked`` is returned."""
    if not ranked or not dense_hits:
        return ranked
    bm_best = max((c.bm25 for c in ranked if c.bm25 is not None), default=0.0)
    if bm_best <= 0:
        return ranked
    best, last = dense_hits[0][1], dense_hits[-1][1]
    spread = best - last
    for c in ranked:
        lexical = c.bm25 / bm_best if c.bm25 is not None else 0.0
        semantic = (c.dense - last) / spread if c.dense is not None and spread > 0 else 0.0
        c.rrf = (1.0 - dense_share) * lexical + dense_share * semantic
    return sorted(ranked, key=lambda c: -c.rrf)  # stable: ties keep the fused order


def gap_cut(scores: Sequence[float], gap: float) -> int:
    """How many of the ranked candidates, given as the learned fusion's ``exp(score - best)`` best first
    (conversation.learned_rerank's ``rrf``), to return: the answer ends after the last one whose score is within
    ``gap`` of the best ranked above it. The score is a listwise softmax's logit, so a gap is a ratio of how
    likely two turns are to be the evidence, whatever the raw BM25 or cosine scales. 0: off."""
    if gap <= 0.0:
        return len(scores)
    keep = math.exp(-gap)
    best, end = 0.0, 0
    for position, score in enumerate(scores):
        if position == 0 or score >= keep * best:
            end = position + 1
        best = max(best, score)
    return end


def relevance_floor(ranked: list[Candidate], min_dense: float) -> tuple[list[Candidate], int]:
    """Drop candidates that are not evidence: no lexical (BM25) match and a dense similarity below
    ``min_dense``. The dense side always has neighbours, so without a floor an unrelated query still
    fills top_k with noise. Returns (kept in order, how many were dropped); 0 turns it off."""
    if min_dense <= 0.0:
        return ranked, 0
    kept = [c for c in ranked if c.bm25 is not None or c.dense is None or c.dense >= min_dense]
    return kept, len(ranked) - len(kept)


def cliff_cut(scores: Sequence[tuple[float | None, float | None]], cliff: float) -> int:
    """How many of the ranked candidates, given as (bm25, dense) best first, to return: the answer
    ends where every candidate left is clearly weaker than the best ranked above it, i.e. each of its
    scores is below ``1 - cliff`` times the best of that kind above it (a score it lacks counts as
    below; a kind no candidate above had does not). What follows is rarely evidence, and the tokens
    are the agent's. Candidates without any score (context a re-ranker added, e.g. the turn after a
    matching question) never end it, and those right after its last memory stay with it. 0: off."""
    if cliff <= 0.0:
        return len(scores)
    keep = 1.0 - cliff
    best_bm25: float | None = None
    best_dense: float | None = None
    end = None
    for position, (bm25, dense) in enumerate(scores):
        if bm25 is not None or dense is not None:
            weak = position > 0 and (bm25 is None or (best_bm25 is not None and bm25 < keep * best_bm25)) \
                and (dense is None or (best_dense is not None and dense < keep * best_dense))
            if not weak:
                end = position + 1
        if bm25 is not None and (best_bm25 is None or bm25 > best_bm25):
            best_bm25 = bm25
        if dense is not None and (best_dense is None or dense > best_dense):
            best_dense = dense
    if end is None:
        return len(scores)
    while end < len(scores) and scores[end] == (None, None):
        end += 1
    return end

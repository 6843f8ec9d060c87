"""Conversations as data: when a memory happened, who said it, which turns belong together.

A memory may state ``occurred_at`` (when it happened, distinct from when it was saved), ``speaker``
(who said it) and ``attachments`` (text descriptions of what was shared with it, e.g. an image
caption). Memories saved in one call form an *episode* (a chat session) when they are turns (have a
speaker), or when the caller names an episode key.

Recall uses these in :func:`rerank`, after rank fusion:

- **episode**: episodes are ranked by BM25 over their whole text fused with their best turn's dense
  similarity; each turn gains ``episode_weight / (EPISODE_K + episode rank)``. A question's words
  are often spread over the turns that answer it.
- **neighbours**: a turn gains ``neighbour_weight`` x the score of the candidate before/after it in
  the same episode (an answer follows a question); with ``expand`` a neighbour that was not a
  candidate joins the list this way.
- **speaker**: when the query names exactly one of the candidates' speakers, that speaker's turns'
  scores are multiplied by ``1 + speaker_boost``.

That is the ``rrf`` fusion. The default, ``learned`` (:func:`learned_rerank`), scores each candidate
turn and each turn next to one by a linear function of the same signals (``FUSION_FEATURES``), with
weights fitted listwise on LoCoMo dev (``scripts/locomo_fusion.py``; notes/locomo.md).

Pure functions apart from :func:`episode_bm25`, which reads the store.
"""

from __future__ import annotations

import json
import math
import re
from datetime import date
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InvalidInputError
from .language import match_query
from .fusion import Candidate

MAX_SPEAKER_CHARS = 100
MAX_EPISODE_CHARS = 200
MAX_ATTACHMENTS = 16
MAX_ATTACHMENT_CHARS = 2000
# Episode ranks enter the turn score as weight / (EPISODE_K + rank); the two episode lists fuse with
# rank constant EPISODE_RRF_K. Both small: only the first few episodes should matter.
EPISODE_K = 3.0
EPISODE_RRF_K = 2.0
EPISODE_DEPTH = 100
# Episode ranking leans on BM25: a whole chat's words are a better episode signal than one turn's vector.
EPISODE_DENSE_WEIGHT = 0.3
# Learned fusion: the features of a candidate turn and their weights, fitted by scripts/locomo_fusion.py
# (softmax over each LoCoMo dev question's candidates, evidence turns as targets; leave-one-conversation-out
# in notes/locomo.md). Shares and gaps are relative to the query's best hit, so the weights do not depend
# on a store's size or score scale.
FUSION_FEATURES = (
    "bm25_share",         # BM25 / the best BM25 hit's (0: no lexical match)
    "dense_gap",          # cosine - the best dense hit's (a turn outside the dense list: the last hit's)
    "rrf",                # the weighted RRF score (0: joined as a neighbour)
    "episode_bm25_share", # its episode's BM25 / the best episode's
    "episode_bm25_rr",    # 1 / (3 + its episode's BM25 rank), 0 when the episode has no match
    "episode_dense_gap",  # its episode's best dense hit - the best dense hit
    "prev_rrf",           # the rrf of the turn before it in the episode (an answer follows a question)
    "next_rrf",           # the rrf of the turn after it
    "prev_dense_gap",     # dense_gap of the turn before it (none: the last hit's gap)
    "speaker_named",      # 1 when the query names exactly one speaker and it said this turn
    "other_speaker",      # 1 when the query names one speaker and another said this turn
    "window_gap",         # cosine of the query and the turn's vector + the previous turn's (same episode), - the best hit
)
# No length feature: it chose longer turns, so more tokens per answer for a small gain (notes/locomo.md).
# Fitted on the built-in int8 model's signals; a model fitted for separately states its own (model_config.json
# fusion_weights, as minilm-l6-tuned3 does: memory/recall.py fusion_weights).
FUSION_WEIGHTS = (2.7485, -1.9433, 7.4981, 3.6537, -4.9851, 4.8948, 18.5504, 8.4499, -1.7118, 1.704, -1.6589, 7.3414)
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


# -- input ----------------------------------------------------------------------------------------

def check_label(value: Any, what: str, limit: int, where: str) -> str | None:
    """A speaker name or an episode key: one line of 1-``limit`` characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
        raise InvalidInputError(f"{where}.{what} must be text of 1-{limit} characters, got {value!r:.40}.")
    return " ".join(value.split())


def check_attachments(values: Any, where: str) -> list[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise InvalidInputError(f"{where}.attachments must be a list of text descriptions (e.g. image captions).")
    if len(values) > MAX_ATTACHMENTS:
        raise InvalidInputError(f"{where}: at most {MAX_ATTACHMENTS} attachments per memory.")
    out = []
    for value in values:
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_ATTACHMENT_CHARS or "\x00" in value:
            raise InvalidInputError(f"{where}.attachments must be texts of 1-{MAX_ATTACHMENT_CHARS} characters.")
        out.append(" ".join(value.split()))
    return out


# -- text -------------------------------------------------------------------------------------------

def date_words(occurred_at: str | None) -> str:
    """``2023-05-08T13:56`` -> ``8 May 2023``: the words a question about that day uses."""
    if not occurred_at:
        return ""
    day = date.fromisoformat(occurred_at[:10])
    return f"{day.day} {_MONTHS[day.month - 1]} {day.year}"


def display_text(content: str, speaker: str | None = None, attachments: Sequence[str] = ()) -> str:
    """What a reader needs besides the date: ``Speaker: content [shares caption]``."""
    text = f"{speaker}: {content}" if speaker else content
    for item in attachments:
        text += f" [shares {item}]"
    return text


def embedding_text(content: str, speaker: str | None = None, occurred_at: str | None = None,
                   attachments: Sequence[str] = ()) -> str:
    """The text a memory's vector is computed from: its display text after its date."""
    text = display_text(content, speaker, attachments)
    words = date_words(occurred_at)
    return f"[{words}] {text}" if words else text


# The memories columns embedding_text needs, in the order stored_embedding_text reads them.
EMBEDDING_COLUMNS = "content, speaker, occurred_at, attachments"


def stored_embedding_text(content: str, speaker: str | None, occurred_at: str | None, attachments: str | None) -> str:
    """embedding_text of a stored row (``EMBEDDING_COLUMNS``): what reindex and backfill embed, as save did."""
    return embedding_text(content, speaker, occurred_at, json.loads(attachments or "[]"))


def search_context(speaker: str | None = None, occurred_at: str | None = None, attachments: Sequence[str] = ()) -> str:
    """Searchable words about a memory that are not its content (the FTS ``context`` column)."""
    return " ".join(part for part in (speaker or "", date_words(occurred_at), *attachments) if part)


# -- recall -----------------------------------------------------------------------------------------

def episode_bm25(store, query: str, session: str | None, tokenizer: str, depth: int = EPISODE_DEPTH) -> list[tuple[int, float]]:
    """(episode id, BM25 over the episode's whole text), best first; ``tokenizer`` is the index's
    (``fts_tokenizer``), which shapes the query."""
    match = match_query(tokenizer, query)
    if match is None:
        return []
    sql = ("SELECT e.id, -bm25(episodes_fts) AS score FROM episodes_fts JOIN episodes e ON e.id = episodes_fts.rowid "
           "WHERE episodes_fts MATCH ?")
    params: list = [match]
    if session is not None:
        sql += " AND e.session_id = ?"
        params.append(session)
    return [(r[0], r[1]) for r in store.read(sql + " ORDER BY score DESC, e.id LIMIT ?", [*params, depth])]


def _rank_map(lists: Sequence[list[tuple[int, float]]], weights: Sequence[float], k: float) -> dict[int, int]:
    scores: dict[int, float] = {}
    for hits, weight in zip(lists, weights):
        for rank, (key, _) in enumerate(hits, start=1):
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    return {key: rank for rank, key in enumerate(sorted(scores, key=lambda x: (-scores[x], x)), start=1)}


def mentioned_speaker(query: str, speakers: set[str]) -> str | None:
    """The one speaker the query names (whole words, any case); None when it names none or several."""
    named = [s for s in speakers if re.search(rf"(?<!\w){re.escape(s)}(?!\w)", query, re.IGNORECASE)]
    return named[0] if len(named) == 1 else None


def rerank(ranked: list[Candidate], info: dict[int, tuple[int | None, str | None]], *, query: str,
           episode_hits: list[tuple[int, float]], dense_hits: list[tuple[int, float]],
           episode_weight: float, neighbour_weight: float, speaker_boost: float, expand: bool = False) -> list[Candidate]:
    """Fused candidates re-scored with their episodes, neighbours and speakers; best first.

    ``info`` maps memory id -> (episode id, speaker) for the candidates and, with ``expand``, their
    id neighbours. Without ``expand`` only candidates are re-scored, so whatever filtered the
    candidates still holds; with it, a neighbour in the same episode may join.
    """
    ranked = list(ranked)
    by_id = {c.id: c for c in ranked}
    base = {c.id: c.rrf for c in ranked}
    if neighbour_weight > 0:
        for cid, score in base.items():
            episode = info.get(cid, (None, None))[0]
            if episode is None:
                continue
            for other in (cid - 1, cid + 1):  # one save call writes an episode's turns with consecutive ids
                if info.get(other, (None, None))[0] != episode or (other not in by_id and not expand):
                    continue
                if other not in by_id:
                    by_id[other] = Candidate(other)
                    ranked.append(by_id[other])
                by_id[other].rrf += neighbour_weight * score
    if episode_weight > 0:
        best_dense: dict[int, float] = {}
        for cid, similarity in dense_hits:
            episode = info.get(cid, (None, None))[0]
            if episode is not None and similarity > best_dense.get(episode, -2.0):
                best_dense[episode] = similarity
        dense_list = sorted(best_dense.items(), key=lambda x: (-x[1], x[0]))
        ranks = _rank_map([episode_hits, dense_list], [1.0 - EPISODE_DENSE_WEIGHT, EPISODE_DENSE_WEIGHT], EPISODE_RRF_K)
        for c in ranked:
            episode = info.get(c.id, (None, None))[0]
            if episode in ranks:
                c.rrf += episode_weight / (EPISODE_K + ranks[episode])
    if speaker_boost > 0:
        speaker = mentioned_speaker(query, {turn[1] for turn in info.values() if turn[1]})
        if speaker is not None:
            for c in ranked:
                if info.get(c.id, (None, None))[1] == speaker:
                    c.rrf *= 1.0 + speaker_boost
    return sorted(ranked, key=lambda c: (-c.rrf, c.bm25_rank or 10**9, c.dense_rank or 10**9, c.id))


def window_similarity(ids: Sequence[int], before: Sequence[int | None], query_vector: np.ndarray,
                      vectors: Mapping[int, np.ndarray], missing: float) -> np.ndarray:
    """Cosine of the query and each turn's vector plus the one of the turn ``before`` it (None: the
    turn alone), renormalised: a short answer ("Yes, twice!") carries its question's words. A turn
    without a stored vector gets ``missing``."""
    if not vectors:
        return np.full(len(ids), missing)
    zero = np.zeros_like(next(iter(vectors.values())))
    own = np.stack([vectors.get(i, zero) for i in ids])
    summed = own + np.stack([vectors.get(b, zero) if b is not None else zero for b in before])
    norms = np.linalg.norm(summed, axis=1)
    cosine = summed @ query_vector / np.where(norms > 0, norms, 1.0)
    return np.where(np.linalg.norm(own, axis=1) > 0, cosine, missing)


def fusion_features(ranked: list[Candidate], info: dict[int, tuple], *, query: str, episode_hits: list[tuple[int, float]],
                    dense_hits: list[tuple[int, float]], query_vector: np.ndarray, vectors: Mapping[int, np.ndarray],
                    expand: bool = False) -> tuple[list[Candidate], list[list[float]]]:
    """The turns :func:`learned_rerank` scores and their ``FUSION_FEATURES``: the candidates and, with
    ``expand``, the turns right before/after one in the same episode. ``info`` maps id -> (episode,
    speaker) for the candidates, the dense hits and the ids up to two either side of a
    candidate (those that are turns); ``vectors`` the stored unit vectors of those ids (missing
    ones are allowed), ``query_vector`` the query's unit vector; ``dense_hits`` must not be empty."""
    def episode(i: int):
        return info.get(i, (None,))[0]

    by_id = {c.id: c for c in ranked}
    pool = list(ranked)
    if expand:
        for c in ranked:
            for other in (c.id - 1, c.id + 1):
                if other not in by_id and episode(c.id) is not None and episode(other) == episode(c.id):
                    by_id[other] = Candidate(other)
                    pool.append(by_id[other])
    base = {c.id: c.rrf for c in ranked}
    dense = dict(dense_hits)
    d_max, d_min = dense_hits[0][1], dense_hits[-1][1]
    bm_max = max((c.bm25 for c in ranked if c.bm25 is not None), default=0.0)
    ep_max = episode_hits[0][1] if episode_hits else 0.0
    ep_score = dict(episode_hits)
    ep_rank = {e: r for r, (e, _) in enumerate(episode_hits, start=1)}
    best: dict[int, float] = {}
    for cid, similarity in dense_hits:
        e = episode(cid)
        if e is not None and similarity > best.get(e, -2.0):
            best[e] = similarity
    speaker = mentioned_speaker(query, {turn[1] for turn in info.values() if turn[1]})
    previous = [c.id - 1 if episode(c.id) is not None and episode(c.id - 1) == episode(c.id) else None for c in pool]
    window = window_similarity([c.id for c in pool], previous, query_vector, vectors, d_min) - d_max
    rows = []
    for c, before, window_gap in zip(pool, previous, window.tolist()):
        e, said = info.get(c.id, (None, None))
        after = c.id + 1 if e is not None and episode(c.id + 1) == e else None
        rows.append([
            c.bm25 / bm_max if c.bm25 is not None and bm_max > 0 else 0.0,
            dense.get(c.id, d_min) - d_max,
            base.get(c.id, 0.0),
            ep_score.get(e, 0.0) / ep_max if ep_max > 0 else 0.0,
            1.0 / (EPISODE_K + ep_rank[e]) if e in ep_rank else 0.0,
            best.get(e, d_min) - d_max,
            base.get(before, 0.0),
            base.get(after, 0.0),
            (dense.get(before, d_min) if before is not None else d_min) - d_max,
            float(speaker is not None and said == speaker),
            float(speaker is not None and said is not None and said != speaker),
            window_gap,
        ])
    return pool, rows


def learned_rerank(ranked: list[Candidate], info: dict[int, tuple], *, query: str, episode_hits: list[tuple[int, float]],
                   dense_hits: list[tuple[int, float]], query_vector: np.ndarray, vectors: Mapping[int, np.ndarray],
                   expand: bool = False, weights: Sequence[float] = FUSION_WEIGHTS) -> list[Candidate]:
    """Candidate turns (and, with ``expand``, their neighbours) ranked by ``weights`` . their
    :func:`fusion_features`, best first, ties by id. Each gets ``rrf = exp(score - best score)``
    (in (0, 1], in rank order), so later steps that scale scores (the time boost) still compose.
    Without dense hits (keyword-only) the features are undefined: the list is returned unchanged."""
    if not dense_hits:
        return ranked
    pool, rows = fusion_features(ranked, info, query=query, episode_hits=episode_hits, dense_hits=dense_hits,
                                 query_vector=query_vector, vectors=vectors, expand=expand)
    scores = [sum(w * f for w, f in zip(weights, row)) for row in rows]
    top = max(scores)
    order = sorted(range(len(pool)), key=lambda i: (-scores[i], pool[i].id))
    for i in order:
        pool[i].rrf = math.exp(scores[i] - top)
    return [pool[i] for i in order]


def index_episodes(conn, episode_ids) -> None:
    """Rewrite the episodes' FTS documents (their memories' context and content, in saved order)
    inside the caller's write transaction; an episode left without memories loses its document."""
    for episode in sorted(set(episode_ids)):
        conn.execute("DELETE FROM episodes_fts WHERE rowid = ?", (episode,))
        conn.execute(
            "INSERT INTO episodes_fts(rowid, text) SELECT ?, group_concat(part, char(10)) FROM "
            "(SELECT context || ' ' || content AS part FROM memories WHERE episode_id = ? ORDER BY id) HAVING count(*) > 0",
            (episode, episode))

"""Candidate generation: the database reads of recall.

:class:`CandidateSearch` finds the two candidate lists recall fuses, BM25 over FTS5 and dense
similarity over the vector index (or sqlite-vec), each limited to a session, tags and filters inside
the search itself; and it reads what the re-rankers need about candidates: their conversation turns
(episode, speaker), their episodes' BM25 and when they happened. The stages that use them are in
:mod:`tinycontext.memory.recall`.
"""

from __future__ import annotations

import contextvars
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from .. import telemetry
from ..config import TinyContextConfig
from ..models.backends import EmbedderProtocol
from ..retrieval import conversation, language
from ..retrieval.bounded_bm25 import RowCounts, bounded_match, merge
from ..retrieval.filters import Filters
from ..retrieval.fusion import Signals, expression_terms
from ..retrieval.postings import BM25_WEIGHTS, Postings
from .store import Store
from .vector_index import VectorIndex

_QUERY_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tinycontext-query")
# sqlite-vec refuses KNN queries with k above this; deeper dense candidate lists are cut to it.
VEC_KNN_MAX = 4096


def filter_sql(tags: Sequence[str], filters: Filters | None, id_column: str) -> tuple[str, list]:
    """`` AND condition`` (or "") and its parameters: ``tags`` is the any-of shorthand, and
    both it and ``filters`` must hold."""
    sql, params = "", []
    for part in (Filters(tags_any=tuple(tags)), filters or Filters()):
        condition, values = part.sql(id_column)
        if condition:
            sql += " AND " + condition
            params += values
    return sql, params


class CandidateSearch:
    """Recall's reads on one store. ``embedder`` returns the engine's embedder (loaded on first use)."""

    def __init__(self, store: Store, index: VectorIndex, config: TinyContextConfig, embedder: Callable[[], EmbedderProtocol | None]):
        self.store, self.index, self.config, self._embedder = store, index, config, embedder
        self.mixed_sessions: set[str] = set()  # sessions whose id range holds other sessions' memories (bm25)
        self.postings = Postings(store, BM25_WEIGHTS)  # the bounded search scored from the store's snapshot, if any
        self.row_counts = RowCounts(store, self.postings)  # the query words' row counts, kept between searches
        self._facts: dict[int, tuple | None] = {}  # id -> (episode id, speaker, tokens, session id), None: no such memory
        self._facts_stamp: tuple[int, int] | None = None
        self._facts_lock = threading.Lock()

    def search(self, query: str, session: str | None, tag_list: list[str], filters: Filters, depth: int, *,
               keyword: bool, dense: bool) -> Signals:
        """Both candidate lists, ``depth`` deep (a list not wanted is None)."""
        if not (keyword and dense):
            return Signals(query, session, tuple(tag_list), filters, depth,
                           tuple(self._bm25_stage(query, session, tag_list, depth, filters)) if keyword else None,
                           tuple(self._dense_stage(query, session, tag_list, depth, filters)) if dense else None)
        # The BM25 search runs on a worker thread while the dense search (query embedding, then the vector scan) runs
        # here: ONNX, numpy and SQLite release the GIL, so on two cores the steps overlap instead of adding up. The
        # dense search is the longer, so it is the one that starts at once, without waiting for a thread to wake.
        # (In this call's context, so that the BM25 stage's span is a child of the recall's.)
        dense_done = threading.Event()

        def keyword_side() -> list[tuple[int, float]]:
            hits = self._bm25_stage(query, session, tag_list, depth, filters)
            if not dense_done.is_set():  # what recall reads about the candidates after fusing, read while it would wait
                self.facts([i for i, _ in hits])
            return hits

        pending = _QUERY_POOL.submit(contextvars.copy_context().run, keyword_side)
        dense_hits = tuple(self._dense_stage(query, session, tag_list, depth, filters))
        dense_done.set()
        return Signals(query, session, tuple(tag_list), filters, depth, tuple(pending.result()), dense_hits)

    def _bm25_stage(self, query: str, session: str | None, tags: Sequence[str], depth: int, filters: Filters) -> list[tuple[int, float]]:
        with telemetry.operation("recall.bm25") as op:
            hits = self.bm25(query, session, tags, depth, filters)
            op.set(candidates=len(hits))
            return hits

    def _dense_stage(self, query: str, session: str | None, tags: Sequence[str], depth: int, filters: Filters) -> list[tuple[int, float]]:
        with telemetry.operation("recall.dense") as op:
            hits = self.dense(query, session, tags, depth, filters)
            op.set(candidates=len(hits))
            return hits

    def bm25(self, query: str, session: str | None, tags: Sequence[str], depth: int, filters: Filters | None = None) -> list[tuple[int, float]]:
        span = None
        if session is not None and self.store.read("SELECT min(id) = max(id) AND min(id) = ? FROM sessions", (session,))[0][0]:
            session = None  # the only session: filtering by it changes nothing, and the join costs time (notes/design_figures.md)
        elif session is not None:
            # FTS5 scores every match before a join could drop other sessions' rows; limited to the
            # session's id range it skips the rows outside it.
            span = self.store.session_span(session)
            if span is None:
                return []
        # The trigram index takes substrings, and terms under 3 characters only through LIKE (language.py).
        aside = None  # words bounded_match set aside: they score, but do not add rows to score
        if self.config.fts_tokenizer == "trigram":
            match, short = language.trigram_query(query)
        else:
            (match, aside), short = bounded_match(self.store, query, self.config.recall_fts_budget, span, self.row_counts), []
        if match is None and not short:
            return []
        if session is not None and session not in self.mixed_sessions:
            # A session's id range usually holds only its own memories, and then the join is not needed.
            # Exact either way: a hit from another session sends the search through the join, and the
            # session is remembered as mixed (ids only grow, so it stays so).
            hits = self.bm25_hits(match, short, None, span, tags, filters, depth, aside)
            if not hits or not self.store.read("SELECT 1 FROM memories WHERE id IN (SELECT value FROM json_each(?)) AND session_id != ? LIMIT 1",
                                               (json.dumps([h[0] for h in hits]), session)):
                return hits
            self.mixed_sessions.add(session)
        return self.bm25_hits(match, short, session, span, tags, filters, depth, aside)

    def bm25_hits(self, match: str | None, short: list[str], session: str | None, span: tuple[int, int] | None,
                  tags: Sequence[str], filters: Filters | None, depth: int, aside: str | None = None) -> list[tuple[int, float]]:
        if session is None:
            # Every FTS row is a memory (triggers), so no join is needed to read ids.
            base, params, id_column = "FROM memories_fts WHERE {where}", [], "rowid"
        else:
            # CROSS JOIN keeps FTS5 the outer loop: driven by the session index, SQLite would run the MATCH once per row.
            base, params, id_column = ("FROM memories_fts CROSS JOIN memories m ON m.id = memories_fts.rowid WHERE {where} "
                                       "AND m.session_id = ?"), [session], "m.id"
        if span is not None:
            base, params = base + " AND memories_fts.rowid BETWEEN ? AND ?", [*params, *span]
        # The filter is part of the FTS query, so the LIMIT keeps the best matches that pass it. The unary
        # "+" keeps SQLite from driving FTS5 by the filter's id list: it would run the MATCH once per id
        # (notes/design_figures.md) instead of once, checking each hit's id.
        where_sql, filter_params = filter_sql(tags, filters, "+" + id_column)
        hits: list[tuple[int, float]] = []
        if match is not None and session is None and not where_sql and not short:
            # With no join or filter: the same list scored from the postings snapshot (None: FTS5), the whole query
            # or, past the budget, the bounded one. Cheaper than FTS5's scoring from a few thousand memories on.
            found = self.postings.bounded_scores(expression_terms(match), expression_terms(aside), depth, span)
            if found is not None:
                return found
        if match is not None:
            weights = ", ".join(map(str, BM25_WEIGHTS))
            sql = (f"SELECT {id_column}, -bm25(memories_fts, {weights}) AS score " + base.format(where="memories_fts MATCH ?")
                   + where_sql + f" ORDER BY score DESC, {id_column} LIMIT ?")
            hits = [(r[0], r[1]) for r in self.store.read(sql, [match, *params, *filter_params, depth])]
            if aside is not None and hits:  # the rows also holding a set-aside word, scored by the whole query
                both = self.store.read(sql, [f"({match}) AND ({aside})", *params, *filter_params, depth])
                hits = merge(hits, [(r[0], r[1]) for r in both], depth)
        if short and len(hits) < depth:
            # Short terms rank after the BM25 hits, by how many of them a memory contains.
            likes = ["(memories_fts.content LIKE ? ESCAPE '\\' OR memories_fts.tags LIKE ? ESCAPE '\\')" for _ in short]
            patterns = [p for term in short for p in (language.like_pattern(term),) * 2]
            seen = {h[0] for h in hits}
            sql = (f"SELECT {id_column}, {' + '.join(likes)} AS score " + base.format(where="(" + " OR ".join(likes) + ")")
                   + where_sql + f" ORDER BY score DESC, {id_column} LIMIT ?")
            rows = self.store.read(sql, [*patterns, *patterns, *params, *filter_params, depth])
            hits += [(r[0], float(r[1])) for r in rows if r[0] not in seen][: depth - len(hits)]
        return hits

    def dense(self, query: str, session: str | None, tags: Sequence[str], depth: int, filters: Filters | None = None, *,
              vector: np.ndarray | None = None) -> list[tuple[int, float]]:
        if vector is None:
            vector = self._embedder().embed_query(query)
        where_sql, filter_params = filter_sql(tags, filters, "id")
        if where_sql:
            with self.store.lock:  # no write of this process between reading the ids that pass and searching
                # The ids that pass, searched exhaustively: the top-k is taken among them only.
                allowed = np.array([r[0] for r in self.store.read("SELECT id FROM memories WHERE 1" + where_sql, filter_params)], np.int64)
                hits = self.index.search(vector, session, min(depth, VEC_KNN_MAX), allowed)
        else:
            hits = self.index.search(vector, session, min(depth, VEC_KNN_MAX))
        if hits is not None:
            return hits
        sql = "SELECT memory_id, distance FROM memory_vectors WHERE embedding MATCH ? AND k = ?"
        params: list = [vector.tobytes(), min(depth, VEC_KNN_MAX)]
        if session is not None:
            sql += " AND session_id = ?"
            params.append(session)
        if where_sql:  # vec0 takes one "rowid IN (...)" per query
            sql += f" AND memory_id IN (SELECT id FROM memories WHERE 1{where_sql})"
            params += filter_params
        rows = self.store.read(sql, params)
        # vec0 allows only ORDER BY distance; break ties by id here so results are deterministic.
        return [(r[0], 1.0 - r[1]) for r in sorted(rows, key=lambda r: (r[1], r[0]))]

    # -- what the re-rankers read -------------------------------------------------------------

    FACTS_MAX = 20_000  # memories whose facts are kept (while the store's stamp holds)

    def facts(self, ids) -> dict[int, tuple]:
        """id -> (episode id, speaker, tokens, session id) of the memories with these ids (those that exist). Kept while
        the store's stamp is unchanged (as RowCounts keeps counts): a recall reads them for the re-rankers and again
        for the page, and the BM25 search reads its hits' while the dense search runs."""
        ids = [int(i) for i in ids]
        # Taken before reading (a later write moves it); None, nothing kept, inside this thread's write transaction or
        # while another thread holds the store lock: reads do not wait for writes.
        stamp = None if self.store.writing else self.store.stamp(wait=False)
        with self._facts_lock:
            if stamp != self._facts_stamp or stamp is None:
                self._facts, self._facts_stamp = {}, stamp
            known = {i: self._facts[i] for i in ids if i in self._facts}
        missing = sorted({i for i in ids if i not in known})  # in key order: fewer page reads
        if missing:
            rows = self.store.read("SELECT id, episode_id, speaker, tokens, session_id FROM memories "
                                   "WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(missing),))
            fresh: dict[int, tuple | None] = dict.fromkeys(missing)
            fresh.update((r[0], r[1:]) for r in rows)
            known.update(fresh)
            with self._facts_lock:
                if stamp is not None and stamp == self._facts_stamp:  # not when another read saw a newer stamp meanwhile
                    if len(self._facts) + len(fresh) > self.FACTS_MAX:
                        self._facts = {}
                    self._facts.update(fresh)
        return {i: found for i, found in known.items() if found is not None}

    def turns(self, ids) -> dict[int, tuple]:
        """id -> (episode id, speaker) of those memories that are conversation turns."""
        return {i: (e, s) for i, (e, s, _, _) in self.facts(ids).items() if e is not None or s is not None}

    def costs(self, ids) -> dict[int, tuple[int, str]]:
        """(tokens, session id) of the memories with these ids (those that exist), by id: what a page's budget needs
        without reading the rows."""
        return {i: (tokens, session) for i, (_, _, tokens, session) in self.facts(ids).items()}

    def vectors(self, ids: list[int]) -> dict[int, np.ndarray]:
        """id -> stored unit vector of those memories that have one (VectorIndex.vectors)."""
        return self.index.vectors(ids)

    def query_vector(self, query: str) -> np.ndarray:
        """The query's vector: the embedder's cache holds it once the dense search has run."""
        return self._embedder().embed_query(query)

    def episode_hits(self, query: str, session: str | None) -> list:
        """Episodes ranked by BM25 over their whole text (see conversation.episode_bm25)."""
        return conversation.episode_bm25(self.store, query, session, self.config.fts_tokenizer)

    def times(self, ids: list[int]) -> dict[int, str]:
        """When each memory happened: ``occurred_at``, else when it was saved."""
        return {r[0]: r[1] for r in self.store.read(
            "SELECT id, coalesce(occurred_at, created_at) FROM memories WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),))}

"""Bounded BM25 work for big databases.

FTS5 scores every row that matches any word of an OR query, so one common word makes a recall over
a million memories read and score most of them (about a second here). So the rows each query word
matches are counted first (FTS5 walks a word's list of rows far faster than it scores them, and
the count stops past the budget), and the most common words are set aside while the rows left to
score exceed the budget (``recall_fts_budget``); the rarest word always stays. Only rows holding a
kept word are scored, but by the whole query: FTS5's bm25 is a sum over the query's phrases, so
``kept AND (set aside)`` scores the rows holding both kinds of word exactly as the full OR query
does (each phrase's IDF is over the whole table), and ``kept`` alone scores those holding only kept
words exactly. The two lists, merged, are the full query's order over the rows holding a kept word
(:func:`merge`); what is lost are rows holding only common words, the least IDF weight. Below the
budget (in practice every database up to tens of thousands of memories) the query is exactly
:func:`tinycontext.retrieval.fusion.fts_query`'s.

The counts are kept between searches (:class:`RowCounts`) while the database is unchanged: the
commonest words, whose counts walk up to the budget's rows each, are the ones that recur.
"""

from __future__ import annotations

import threading

from .fusion import match_expression, query_terms

COUNT = "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? AND rowid BETWEEN ? AND ? LIMIT ?)"


def count_rows(store, term: str, low: int, high: int, cap: int) -> int:
    """The rows holding ``term`` with an id in [``low``, ``high``], counted up to ``cap``."""
    return store.read(COUNT, (match_expression([term]), low, high, cap))[0][0]


class RowCounts:
    """The rows each word matches in an id range, counted up to a cap, kept while the database's
    stamp (``Store.stamp``) is unchanged; counted afresh inside this thread's write transaction,
    whose changes may still roll back."""

    MAX_WORDS = 20_000  # past it the copy starts over (a few MB)

    def __init__(self, store, snapshot=None):
        self.store = store
        self.snapshot = snapshot  # a postings.Postings: the same counts from the store's snapshot, where it has one
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._counts: dict[tuple[str, int, int, int], int] = {}

    def count(self, terms: list[str], low: int, high: int, cap: int) -> list[int]:
        stamp = None if self.store.writing else self.store.stamp()  # taken before counting: a later write moves it
        with self._lock:
            if stamp != self._stamp:
                self._counts, self._stamp = {}, stamp
            counts = [self._counts.get((t, low, high, cap)) if stamp is not None else None for t in terms]
        missing = [i for i, c in enumerate(counts) if c is None]
        if missing and self.snapshot is not None:  # no walk of each word's row list through FTS5
            found = self.snapshot.counts([terms[i] for i in missing], low, high, cap)
            for i, c in zip(missing, found or [None] * len(missing)):
                counts[i] = c
        for i, t in enumerate(terms):
            if counts[i] is None:
                counts[i] = count_rows(self.store, t, low, high, cap)
        with self._lock:
            if stamp is not None and stamp == self._stamp:  # not when another search saw a newer stamp meanwhile
                if len(self._counts) + len(terms) > self.MAX_WORDS:
                    self._counts = {}
                self._counts.update(((t, low, high, cap), c) for t, c in zip(terms, counts))
        return counts


def bounded_match(store, query: str, budget: int, span: tuple[int, int] | None = None,
                  counts: RowCounts | None = None) -> tuple[str | None, str | None]:
    """The FTS5 MATCH expressions for ``query``: the words kept to fit ``budget`` rows (0: no bound),
    and those set aside (None when none is). ``span``: the (lowest, highest) memory id the search is
    limited to; ``counts``: the store's kept word counts (else counted here)."""
    terms = query_terms(query)
    if budget <= 0 or len(terms) < 2:
        return match_expression(terms), None
    low, high = span or (1, store.read("SELECT max(id) FROM memories")[0][0] or 0)
    if high - low + 1 <= budget:
        return match_expression(terms), None  # fewer rows than the budget in all (ids only grow)
    cost = (counts.count(terms, low, high, budget + 1) if counts is not None
            else [count_rows(store, t, low, high, budget + 1) for t in terms])
    kept = list(range(len(terms)))
    for i in sorted(kept, key=lambda i: (-cost[i], i)):
        if len(kept) == 1 or sum(cost[j] for j in kept) <= budget:
            break
        kept.remove(i)
    aside = [t for i, t in enumerate(terms) if i not in kept]
    return match_expression([terms[i] for i in kept]), match_expression(aside)


def merge(kept_hits: list[tuple[int, float]], both_hits: list[tuple[int, float]], depth: int) -> list[tuple[int, float]]:
    """The full query's best ``depth`` among rows holding a kept word, from the best ``depth`` of
    ``kept`` (exact for rows without a word set aside) and of ``kept AND (set aside)`` (exact for
    the others). A row of the first list that also holds a set-aside word but missed the second's
    ``depth`` scores below that list's last, so it cannot displace an exact one."""
    scores = dict(kept_hits)
    scores.update(both_hits)
    return sorted(scores.items(), key=lambda h: (-h[1], h[0]))[:depth]

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

import json
import math
import re
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

    def __init__(self, store):
        self.store = store
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._counts: dict[tuple[str, int, int, int], int] = {}

    def count(self, terms: list[str], low: int, high: int, cap: int) -> list[int]:
        stamp = None if self.store.writing else self.store.stamp()  # taken before counting: a later write moves it
        with self._lock:
            if stamp != self._stamp:
                self._counts, self._stamp = {}, stamp
            counts = [self._counts.get((t, low, high, cap)) if stamp is not None else None for t in terms]
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


def phrases(expression: str) -> list[str]:
    """The words of a :func:`~tinycontext.retrieval.fusion.match_expression` (quoted words, which hold
    no quote, joined by OR), in its order."""
    return [t[1:-1] for t in expression.split(" OR ")]


def merge(kept_hits: list[tuple[int, float]], both_hits: list[tuple[int, float]], depth: int) -> list[tuple[int, float]]:
    """The full query's best ``depth`` among rows holding a kept word, from the best ``depth`` of
    ``kept`` (exact for rows without a word set aside) and of ``kept AND (set aside)`` (exact for
    the others). A row of the first list that also holds a set-aside word but missed the second's
    ``depth`` scores below that list's last, so it cannot displace an exact one."""
    scores = dict(kept_hits)
    scores.update(both_hits)
    return sorted(scores.items(), key=lambda h: (-h[1], h[0]))[:depth]


# FTS5's bm25 constants (fts5_aux.c): the set-aside words are scored here by the same formula.
K1, B = 1.2, 0.75
ALL_ROWS = (-(2**63), 2**63 - 1, -1)  # a word's rows in the whole table, uncounted cap: FTS5's IDF counts them all
BATCH = 64  # rows whose set-aside words are scored at a time, best kept score first


def varints(blob: bytes) -> list[int]:
    """The SQLite varints of an FTS5 record (the averages row, a docsize row)."""
    out, i = [], 0
    while i < len(blob):
        value = 0
        for n in range(9):
            byte = blob[i]
            i += 1
            if n == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if byte < 0x80:
                break
        out.append(value)
    return out


class AsideScorer:
    """The set-aside words' share of FTS5's bm25 for given rows, computed here instead of by a second
    FTS5 query.

    FTS5 computes each phrase's IDF by walking the phrase's whole row list on every statement; for the
    set-aside words (the commonest, hundreds of thousands of rows at 1M) that walk was most of the
    ``kept AND (set aside)`` query. Here the IDF comes from the kept row counts (:class:`RowCounts`,
    uncapped), the row's length from FTS5's own docsize table and the table's totals from its averages
    record, and the words' frequencies from the rows' text tokenised by FTS5 itself: the rows are put
    into an in-memory FTS5 table with the same tokenizer and columns, whose fts5vocab instances are read
    (rolled back after). So the sum is FTS5's, term for term and in its order: a row's score is its kept
    words' score (the first query's) plus each set-aside phrase's term, added in the set-aside order, as
    bm25 adds the phrases of ``kept AND (set aside)``. When a row's text does not tokenise to the
    indexed lengths (the index built by another SQLite), or a set-aside word is not one token,
    :meth:`score` returns None and the caller runs FTS5's query instead."""

    def __init__(self, store, counts: "RowCounts", weights: tuple[float, ...]):
        self.store, self.counts, self.weights = store, counts, weights
        self._local = threading.local()  # an in-memory FTS5 database per thread (sqlite connections are not shared)
        self._layout: tuple[list[str], str] | None = None

    def _columns(self) -> tuple[list[str], str]:
        """memories_fts's columns and tokenize argument, as its schema declares them."""
        if self._layout is None:
            columns = [r[1] for r in self.store.read("PRAGMA table_info(memories_fts)")]
            sql = self.store.read("SELECT sql FROM sqlite_master WHERE name = 'memories_fts'")[0][0]
            tokenize = re.search(r"tokenize\s*=\s*'([^']*)'", sql)
            self._layout = columns, tokenize.group(1) if tokenize else "unicode61"
        return self._layout

    def _scratch(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            columns, tokenize = self._columns()
            conn = self.store.driver.connect(":memory:", isolation_level=None)  # the same SQLite, so the same tokenizer
            conn.execute(f"CREATE VIRTUAL TABLE rows USING fts5({', '.join(columns)}, tokenize='{tokenize}')")
            conn.execute("CREATE VIRTUAL TABLE rows_terms USING fts5vocab(rows, instance)")
            conn.execute(f"CREATE VIRTUAL TABLE words USING fts5(word, tokenize='{tokenize}')")
            conn.execute("CREATE VIRTUAL TABLE words_terms USING fts5vocab(words, instance)")
            self._local.conn = conn
        return conn

    def score(self, terms: list[str], rows: list[tuple[int, float]]) -> list[float] | None:
        """Each row's full score: its kept score (``rows``: (id, kept words' score)) plus the share of
        ``terms`` (the set-aside words, in their order in the query); None when it cannot be FTS5's."""
        columns, _ = self._columns()
        ids = json.dumps([r[0] for r in rows])
        texts = self.store.read(f"SELECT id, {', '.join(columns)} FROM memories WHERE id IN (SELECT value FROM json_each(?))", (ids,))
        sizes = dict(self.store.read("SELECT id, sz FROM memories_fts_docsize WHERE id IN (SELECT value FROM json_each(?))", (ids,)))
        totals = varints(self.store.read("SELECT block FROM memories_fts_data WHERE id = 1")[0][0])
        hits = self.counts.count(terms, *ALL_ROWS)
        if len(texts) != len(rows) or len(sizes) != len(rows):
            return None
        conn = self._scratch()
        conn.execute("BEGIN")
        try:
            conn.executemany(f"INSERT INTO rows(rowid, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})", texts)
            conn.executemany("INSERT INTO words(rowid, word) VALUES (?, ?)", list(enumerate(terms)))
            tokens: dict[int, list[str]] = {}
            for doc, term in conn.execute("SELECT doc, term FROM words_terms"):
                tokens.setdefault(doc, []).append(term)
            if any(len(tokens.get(i, ())) != 1 for i in range(len(terms))):
                return None  # a phrase of several tokens (or none): FTS5's own query scores it
            stem = [tokens[i][0] for i in range(len(terms))]
            if dict(conn.execute("SELECT id, sz FROM rows_docsize")) != sizes:
                return None  # the text does not tokenise to what the index holds
            freq: dict[tuple[int, str], float] = {}
            marks = ", ".join("?" * len(set(stem)))
            for doc, col, term in conn.execute(f"SELECT doc, col, term FROM rows_terms WHERE term IN ({marks})", sorted(set(stem))):
                weight = self.weights[columns.index(col)] if columns.index(col) < len(self.weights) else 1.0
                freq[doc, term] = freq.get((doc, term), 0.0) + weight
        finally:
            conn.execute("ROLLBACK")
        n_row, n_token = totals[0], sum(totals[1 : 1 + len(columns)])
        avgdl = float(n_token) / float(n_row)
        idf = []
        for n_hit in hits:  # fts5Bm25GetData
            value = math.log((n_row - n_hit + 0.5) / (n_hit + 0.5))
            idf.append(value if value > 0.0 else 1e-6)
        out = []
        for memory_id, kept in rows:
            length = float(sum(varints(sizes[memory_id])))
            score = kept  # the kept phrases' sum (the first query's -bm25, negated twice: exact), added first as FTS5 does
            for j, s in enumerate(stem):
                f = freq.get((memory_id, s))
                if f:  # a phrase absent from the row adds 0.0 in FTS5, which changes no sum
                    score += idf[j] * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * length / avgdl)))
            out.append(score)
        return out

    def bound(self, terms: list[str]) -> float:
        """More than the set-aside words can add to any row's score: each phrase's term is below
        IDF * (k1 + 1) for any frequency."""
        totals = varints(self.store.read("SELECT block FROM memories_fts_data WHERE id = 1")[0][0])
        n_row = totals[0]
        return sum(max(math.log((n_row - n + 0.5) / (n + 0.5)), 1e-6) * (K1 + 1.0) for n in self.counts.count(terms, *ALL_ROWS))


def best_with_aside(kept_rows: list[tuple[int, float]], window: int, terms: list[str], depth: int,
                    scorer: AsideScorer) -> list[tuple[int, float]] | None:
    """The full query's best ``depth`` among the rows holding a kept word, exactly what :func:`merge` of
    the two FTS5 queries returns, from the kept query's best ``window`` rows (``kept_rows``, best first)
    alone: rows are scored with the set-aside words (``terms``) in the kept order until the next one
    could not reach the ``depth``-th full score even if it held every set-aside word as often as bm25
    rewards (:meth:`AsideScorer.bound`): a row's full score is its kept score plus less than that. None
    when the window runs out first, or the scorer cannot score like FTS5: the caller runs the query."""
    # The bound is a sum of floats like the scores: widened a little so that rounding cannot let a row past it.
    bound = scorer.bound(terms) * (1 + 1e-9) + 1e-12
    done: list[tuple[int, float]] = []
    for start in range(0, len(kept_rows), BATCH):
        if len(done) >= depth and kept_rows[start][1] + bound < done[depth - 1][1]:
            return done[:depth]
        batch = kept_rows[start:start + BATCH]
        scores = scorer.score(terms, batch)
        if scores is None:
            return None
        done = sorted(done + [(r[0], s) for r, s in zip(batch, scores)], key=lambda h: (-h[1], h[0]))
    if len(kept_rows) < window or (len(done) >= depth and kept_rows[-1][1] + bound < done[depth - 1][1]):
        return done[:depth]  # every row holding a kept word was seen, or those past the window cannot reach the list
    return None

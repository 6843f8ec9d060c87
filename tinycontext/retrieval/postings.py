"""Per-word postings for the bounded BM25, scored with numpy (issue 25; work in progress, not used by recall yet).

At 1M memories FTS5's bm25 is the floor of the bounded search (notes/bench_scale.md, session 16): it scores every
row holding a kept word, and walks each set-aside word's whole row list for its IDF on every statement. The same
ranking computed with numpy from each word's postings (row ids and column-weighted frequencies) gave FTS5's list
exactly, floats included, at ~9x less CPU. This module holds that: a derived table of postings built from FTS5's own
index (so FTS5 stays the source of the tokens), and :func:`bounded_scores`, the kept and set-aside words' scores
summed phrase by phrase in the order FTS5's ``kept AND (set aside)`` query adds them.

State: built in bulk from ``fts5vocab`` only; saves and deletes do not maintain it yet (the plan: a delta table
written by the engine's write path, merged like FTS5 merges segments), and recall does not call it.
"""

from __future__ import annotations

import math

import numpy as np

# FTS5's bm25 constants (fts5_aux.c).
K1, B = 1.2, 0.75
SCHEMA = "CREATE TABLE IF NOT EXISTS memory_postings(term TEXT PRIMARY KEY, rows BLOB NOT NULL, freqs BLOB NOT NULL)"


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


def build(conn, weights: tuple[float, ...]) -> int:
    """(Re)build memory_postings from memories_fts's index: per token, its rows (uint32, ascending) and each
    row's frequency weighted by column as bm25 weighs it (stored doubled as uint16: the weights are halves).
    Returns the number of tokens."""
    columns = [r[1] for r in conn.execute("PRAGMA table_info(memories_fts)")]
    weight = {c: (weights[i] if i < len(weights) else 1.0) for i, c in enumerate(columns)}
    conn.execute(SCHEMA)
    conn.execute("DELETE FROM memory_postings")
    conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.postings_source USING fts5vocab(main, memories_fts, instance)")
    case = " ".join(f"WHEN '{c}' THEN {2 * w!r}" for c, w in weight.items())
    terms = [t for t, in conn.execute("SELECT DISTINCT term FROM temp.postings_source")]
    for term in terms:
        flat, = conn.execute(f"SELECT group_concat(doc || ' ' || (CASE col {case} END), ' ') FROM temp.postings_source WHERE term = ?",
                             (term,)).fetchone()
        pairs = np.array(flat.split(), np.float64).reshape(-1, 2)
        rows, where = np.unique(pairs[:, 0].astype(np.int64), return_inverse=True)
        doubled = np.zeros(len(rows))
        np.add.at(doubled, where, pairs[:, 1])
        conn.execute("INSERT INTO memory_postings VALUES (?, ?, ?)",
                     (term, rows.astype(np.uint32).tobytes(), doubled.astype(np.uint16).tobytes()))
    return len(terms)


class Postings:
    """Reads memory_postings for one store and scores the bounded query from it."""

    def __init__(self, store, tokenize: str):
        self.store = store
        self._lengths: tuple[tuple[int, int], np.ndarray] | None = None  # (store stamp, tokens a row by id)
        self._tokens = store.driver.connect(":memory:")  # the same SQLite, so the same tokenizer as memories_fts
        self._tokens.execute(f"CREATE VIRTUAL TABLE words USING fts5(word, tokenize='{tokenize}')")
        self._tokens.execute("CREATE VIRTUAL TABLE words_terms USING fts5vocab(words, instance)")

    def token(self, word: str) -> str | None:
        """The one token FTS5 makes of ``word`` (None when it makes several or none: a phrase)."""
        self._tokens.execute("DELETE FROM words")
        self._tokens.execute("INSERT INTO words(word) VALUES (?)", (word,))
        tokens = [t for t, in self._tokens.execute("SELECT term FROM words_terms")]
        return tokens[0] if len(tokens) == 1 else None

    def lengths(self) -> np.ndarray:
        """Every row's length in tokens (FTS5's docsize), by id: read once while the database is unchanged
        (``Store.stamp``); per question the rows holding a kept word are thousands, too many to read each time."""
        stamp = self.store.stamp()
        if self._lengths is None or self._lengths[0] != stamp:
            rows = self.store.read("SELECT id, sz FROM memories_fts_docsize")
            lengths = np.zeros(max((r[0] for r in rows), default=0) + 1, np.float64)
            lengths[[r[0] for r in rows]] = [float(sum(varints(r[1]))) for r in rows]
            self._lengths = stamp, lengths
        return self._lengths[1]

    def read(self, token: str) -> tuple[np.ndarray, np.ndarray]:
        found = self.store.read("SELECT rows, freqs FROM memory_postings WHERE term = ?", (token,))
        if not found:
            return np.zeros(0, np.int64), np.zeros(0)
        return np.frombuffer(found[0][0], np.uint32).astype(np.int64), np.frombuffer(found[0][1], np.uint16) * 0.5

    def bounded_scores(self, kept: list[str], aside: list[str], depth: int) -> list[tuple[int, float]] | None:
        """The full query's best ``depth`` among rows holding a kept word, as ``merge`` of FTS5's two queries
        returns them (whole table, no filters); None when a word is a phrase of several tokens."""
        tokens = [self.token(w) for w in kept + aside]
        if any(t is None for t in tokens):
            return None
        lists = [self.read(t) for t in tokens]
        totals = varints(self.store.read("SELECT block FROM memories_fts_data WHERE id = 1")[0][0])
        n_row, n_token = totals[0], sum(totals[1:])
        avgdl = float(n_token) / float(n_row)
        rows = np.unique(np.concatenate([lists[i][0] for i in range(len(kept))]))
        if not len(rows):
            return []
        length = self.lengths()[rows]
        norm = K1 * (1 - B + B * length / avgdl)
        score = np.zeros(len(rows))
        for found, freq in lists:  # phrase by phrase, in the order FTS5 adds them (fts5Bm25Function)
            if not len(found):
                continue  # a phrase absent from every row adds 0.0
            idf = math.log((n_row - len(found) + 0.5) / (len(found) + 0.5))
            idf = idf if idf > 0.0 else 1e-6
            at = np.searchsorted(found, rows)
            at[at == len(found)] = 0
            hit = found[at] == rows
            f = freq[at[hit]]
            score[hit] += idf * ((f * (K1 + 1.0)) / (f + norm[hit]))
        order = np.lexsort((rows, -score))[:depth]
        return [(int(rows[i]), float(score[i])) for i in order]

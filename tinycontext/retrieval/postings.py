"""A postings snapshot of the full-text index, for keyword search (BM25) scored with numpy (issue 25).

At 1M memories FTS5's bm25 is the floor of the bounded search (notes/bench_scale.md, sessions 16-17): it scores
every row holding a kept word, and walks each set-aside word's whole row list for its IDF on every statement. The
same ranking computed with numpy from each word's postings (row ids and column-weighted frequencies) gives FTS5's
list exactly, floats included, at several times less CPU; so does a query below the budget (no word set aside),
which it scores whole (from ~5k memories cheaper than FTS5's, notes/bench_scale.md, session 21).

The snapshot is derived data, built from FTS5's own index (so FTS5 stays the source of the tokens) by
:func:`build` in one write transaction (``Store.optimize``: a failed build leaves the previous snapshot or none):
``memory_postings`` (per token: row ids, frequencies), ``memory_postings_meta`` (one row: the snapshot's id, the
tokenizer, every row's length in tokens) and ``memory_postings_changes``, which triggers on ``memories`` fill with
the id of every row inserted, updated or deleted after the build, whichever process writes. So the snapshot is
never rebuilt per save and never stale: :class:`Postings` scores the rows not changed since the build from the
snapshot, and the changed ones from an in-memory FTS5 copy of their current text (same tokenizer, so the same
tokens), all with the current table statistics (row count and average length from FTS5's averages record, each
word's row count = its unchanged snapshot rows + its changed rows holding it). Past :data:`MAX_CHANGES` changed
rows the search falls back to FTS5 until the next build. A snapshot of another tokenizer than memories_fts's is not used. A store without a
snapshot searches as before.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from datetime import datetime, timezone

import numpy as np

from .language import _TOKENIZE

# FTS5's bm25 constants (fts5_aux.c).
K1, B = 1.2, 0.75
# bm25's column weights for memories_fts (content, tags, context): tags count half.
BM25_WEIGHTS = (1.0, 0.5, 1.0)
# Store.optimize builds a snapshot from this many memories: it pays the build (~0.1 ms a memory), and what it saves a
# search grows with the store (notes/bench_scale.md, sessions 19 and 21). An import's own optimize builds one from
# IMPORT_MIN_MEMORIES: there the build runs inside the user's import call and would double a 10k-20k import's time.
MIN_MEMORIES = 5_000
IMPORT_MIN_MEMORIES = 50_000
# Rows changed since the build past which searches use FTS5 again until the next build: each changed row is
# copied (tokenised) once into the in-memory index, and every search masks them out of the snapshot's lists.
MAX_CHANGES = 10_000
# Decoded snapshot lists kept between searches (a search reads each word's list twice: for the word counts that bound
# the query, then to score it; and questions share their common words, whose lists are the longest): up to this
# many bytes of row ids and frequencies, least recently used dropped.
LISTS_CACHE_BYTES = 16 * 2**20
TRIGGERS = ("memory_postings_ai", "memory_postings_ad", "memory_postings_au")
TABLES = ("memory_postings", "memory_postings_meta", "memory_postings_changes")
SCHEMA = (
    "CREATE TABLE memory_postings(term TEXT PRIMARY KEY, rows BLOB NOT NULL, freqs BLOB NOT NULL)",
    "CREATE TABLE memory_postings_meta(one INTEGER PRIMARY KEY CHECK (one = 1), snapshot TEXT NOT NULL, "
    "tokenize TEXT NOT NULL, memories INTEGER NOT NULL, lengths BLOB NOT NULL, built_at TEXT NOT NULL)",
    "CREATE TABLE memory_postings_changes(seq INTEGER PRIMARY KEY, id INTEGER NOT NULL)",
    "CREATE TRIGGER memory_postings_ai AFTER INSERT ON memories BEGIN "
    "INSERT INTO memory_postings_changes(id) VALUES (new.id); END",
    "CREATE TRIGGER memory_postings_ad AFTER DELETE ON memories BEGIN "
    "INSERT INTO memory_postings_changes(id) VALUES (old.id); END",
    # The columns memories_fts indexes (schema v3's memories_au): other updates change no token. An update is one
    # change (two when it moved the row to another id).
    "CREATE TRIGGER memory_postings_au AFTER UPDATE OF content, tags, context ON memories BEGIN "
    "INSERT INTO memory_postings_changes(id) VALUES (old.id); "
    "INSERT INTO memory_postings_changes(id) SELECT new.id WHERE new.id != old.id; END",
)


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


def drop(conn) -> None:
    """Remove the snapshot and its triggers (a store without one searches through FTS5 alone)."""
    for trigger in TRIGGERS:
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    for table in TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def exists(conn) -> bool:
    return bool(conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memory_postings_meta'").fetchone())


def changes(conn) -> int:
    """Rows changed since the build (a row changed twice counts twice); 0 without a snapshot."""
    if not exists(conn):
        return 0
    return conn.execute("SELECT coalesce(max(seq), 0) FROM memory_postings_changes").fetchone()[0]  # seq only grows


def _tokenize(conn) -> str:
    """memories_fts's tokenizer spec, from its own definition."""
    return _TOKENIZE.search(conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memories_fts'").fetchone()[0]).group(1)


def wanted(conn, min_memories: int | None = None) -> bool:
    """Whether optimize should (re)build the snapshot: rows changed since the one there is or another tokenizer
    since (a snapshot of the old tokens is never used), or none yet on a store of ``min_memories`` (None:
    MIN_MEMORIES) searched by words (not trigrams)."""
    if exists(conn):
        return changes(conn) > 0 or conn.execute("SELECT tokenize FROM memory_postings_meta").fetchone()[0] != _tokenize(conn)
    spec = _tokenize(conn)
    return "trigram" not in spec and conn.execute("SELECT count(*) FROM memories").fetchone()[0] >= (MIN_MEMORIES if min_memories is None else min_memories)


def _weighted(columns: list[str], weights: tuple[float, ...]) -> dict[str, int]:
    """Each column's bm25 weight, doubled so that it is a whole number (the weights are halves)."""
    doubled = {c: 2 * (weights[i] if i < len(weights) else 1.0) for i, c in enumerate(columns)}
    if any(w != int(w) for w in doubled.values()):
        raise ValueError(f"bm25 weights must be multiples of 0.5 to be stored exactly: {weights}")
    return {c: int(w) for c, w in doubled.items()}


def _freqs_blob(doubled: np.ndarray) -> bytes:
    """Doubled frequencies as uint16, or uint32 for a token past 32,767 instances in a row (read by size)."""
    return doubled.astype(np.uint16 if doubled.max(initial=0) <= np.iinfo(np.uint16).max else np.uint32).tobytes()


def _find(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``values`` would sit in the sorted, non-empty ``ids``, and whether it is there."""
    at = np.minimum(np.searchsorted(ids, values), len(ids) - 1)
    return at, ids[at] == values


def _union(lists: list[np.ndarray]) -> np.ndarray:
    """The sorted union of sorted lists without repeats (np.unique's answer): a stable sort merges the sorted runs
    in about linear time, where np.unique hashes then sorts, many times slower on a common word's list."""
    merged = np.sort(np.concatenate(lists), kind="stable")
    return merged[np.concatenate(([True], merged[1:] != merged[:-1]))] if len(merged) else merged


def _best(rows: np.ndarray, score: np.ndarray, depth: int) -> np.ndarray:
    """Positions of the ``depth`` best by score (descending), then row (ascending), in that order: sorted are only
    the rows scoring at least the ``depth``-th best score, which every row of the answer does."""
    among = np.arange(len(score))
    if len(score) > depth:
        among = np.flatnonzero(score >= -np.partition(-score, depth - 1)[depth - 1])
    return among[np.lexsort((rows[among], -score[among]))][:depth]


def build(conn, weights: tuple[float, ...] = BM25_WEIGHTS) -> dict | None:
    """(Re)build the snapshot from memories_fts's index, inside the caller's write transaction (all or nothing):
    per token its rows (uint32, ascending) and each row's frequency weighted by column as bm25 weighs it (doubled),
    and every row's length. None (and no snapshot) on the trigram tokenizer, which recall searches by substrings."""
    drop(conn)
    spec = _tokenize(conn)
    if "trigram" in spec:
        return None
    for statement in SCHEMA:
        conn.execute(statement)
    weight = _weighted([r[1] for r in conn.execute("PRAGMA table_info(memories_fts)")], weights)
    conn.execute("CREATE VIRTUAL TABLE temp.postings_source USING fts5vocab(main, memories_fts, instance)")
    try:
        case = " ".join(f"WHEN '{c}' THEN {w}" for c, w in weight.items())
        terms = [t for t, in conn.execute("SELECT term FROM temp.postings_source GROUP BY term")]
        for term in terms:
            # One string per token: fts5vocab yields ~600 ns an instance row by row, ~370 ns this way (session 16).
            flat, = conn.execute(f"SELECT group_concat(doc || ' ' || (CASE col {case} END), ' ') FROM temp.postings_source "
                                 "WHERE term = ?", (term,)).fetchone()
            pairs = np.array(flat.split(), np.int64).reshape(-1, 2)
            rows, where = np.unique(pairs[:, 0], return_inverse=True)
            doubled = np.zeros(len(rows), np.int64)
            np.add.at(doubled, where, pairs[:, 1])
            conn.execute("INSERT INTO memory_postings VALUES (?, ?, ?)", (term, rows.astype(np.uint32).tobytes(), _freqs_blob(doubled)))
    finally:
        conn.execute("DROP TABLE temp.postings_source")
    sizes = conn.execute("SELECT id, sz FROM memories_fts_docsize").fetchall()
    lengths = np.zeros(max((r[0] for r in sizes), default=0) + 1, np.uint32)
    lengths[[r[0] for r in sizes]] = [sum(varints(r[1])) for r in sizes]
    conn.execute("INSERT INTO memory_postings_meta VALUES (1, ?, ?, ?, ?, ?)",
                 (uuid.uuid4().hex, spec, len(sizes), lengths.tobytes(), datetime.now(timezone.utc).isoformat()))
    return {"tokens": len(terms), "memories": len(sizes)}


def status(conn) -> dict | None:
    """What stats shows: the snapshot's size and build time, rows changed since, and whether searches use it."""
    if not exists(conn):
        return None
    memories, built_at, tokenize = conn.execute("SELECT memories, built_at, tokenize FROM memory_postings_meta").fetchone()
    changed = changes(conn)
    return {"memories": memories, "built_at": built_at, "changes": changed,
            "used": changed <= MAX_CHANGES and tokenize == _tokenize(conn)}


class _Snapshot:
    """What one snapshot's searches keep in RAM: its row lengths, and an in-memory FTS5 index of the rows changed
    since the build, as far as the changes table has been read (``synced``)."""

    def __init__(self, snapshot: str, tokenize: str, lengths: bytes, driver):
        self.snapshot = snapshot
        self.lengths = np.frombuffer(lengths, np.uint32)
        self.synced = 0
        self.dirty = np.zeros(0, np.int64)  # every row id changed since the build, sorted
        self.changed_ids = np.zeros(0, np.int64)  # those that exist now (in `changed`), sorted
        self.changed_lengths = np.zeros(0, np.uint32)
        self.index = driver.connect(":memory:", check_same_thread=False)  # the same SQLite, so the same tokenizers
        self.index.execute(f"CREATE VIRTUAL TABLE changed USING fts5(content, tags, context, tokenize='{tokenize}')")
        self.index.execute("CREATE VIRTUAL TABLE changed_terms USING fts5vocab(changed, instance)")
        self.index.execute(f"CREATE VIRTUAL TABLE words USING fts5(word, tokenize='{tokenize}')")
        self.index.execute("CREATE VIRTUAL TABLE words_terms USING fts5vocab(words, instance)")
        self.tokens: dict[str, str | None] = {}  # word -> token (the tokenizer is the snapshot's)
        self.lists: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()  # token -> its snapshot list, decoded
        self.lists_bytes = 0

    def sync(self, conn, upto: int) -> None:
        """Copy the rows changed after ``synced`` (up to change ``upto``) as they are now in ``conn``'s view."""
        ids = [r[0] for r in conn.execute("SELECT DISTINCT id FROM memory_postings_changes WHERE seq > ? AND seq <= ?",
                                          (self.synced, upto))]
        listed = json.dumps(ids)
        self.index.execute("DELETE FROM changed WHERE rowid IN (SELECT value FROM json_each(?))", (listed,))
        self.index.executemany("INSERT INTO changed(rowid, content, tags, context) VALUES (?, ?, ?, ?)",
                               conn.execute("SELECT id, content, tags, context FROM memories WHERE id IN (SELECT value FROM json_each(?))",
                                            (listed,)))
        self.dirty = np.union1d(self.dirty, np.array(ids, np.int64))
        sizes = self.index.execute("SELECT id, sz FROM changed_docsize ORDER BY id").fetchall()
        self.changed_ids = np.array([r[0] for r in sizes], np.int64)
        self.changed_lengths = np.array([sum(varints(r[1])) for r in sizes], np.uint32)
        self.synced = upto

    def token(self, word: str) -> str | None:
        """The one token FTS5 makes of ``word`` (None when it makes several or none: a phrase)."""
        if word not in self.tokens:
            self.index.execute("DELETE FROM words")
            self.index.execute("INSERT INTO words(word) VALUES (?)", (word,))
            tokens = [t for t, in self.index.execute("SELECT term FROM words_terms")]
            if len(self.tokens) >= 100_000:
                self.tokens.clear()
            self.tokens[word] = tokens[0] if len(tokens) == 1 else None
        return self.tokens[word]

    def snapshot_list(self, conn, token: str) -> tuple[np.ndarray, np.ndarray]:
        """``token``'s rows in the snapshot (ascending, int64) and their weighted frequencies: a snapshot's lists never
        change (a build makes a new snapshot), so they are kept decoded up to LISTS_CACHE_BYTES."""
        found = self.lists.get(token)
        if found is not None:
            self.lists.move_to_end(token)
            return found
        row = conn.execute("SELECT rows, freqs FROM memory_postings WHERE term = ?", (token,)).fetchone()
        rows, freqs = np.zeros(0, np.int64), np.zeros(0)
        if row:
            rows = np.frombuffer(row[0], np.uint32).astype(np.int64)
            freqs = np.frombuffer(row[1], np.uint16 if len(row[1]) == 2 * len(rows) else np.uint32) * 0.5
        self.lists[token] = rows, freqs
        self.lists_bytes += rows.nbytes + freqs.nbytes
        while self.lists_bytes > LISTS_CACHE_BYTES and len(self.lists) > 1:
            old_rows, old_freqs = self.lists.popitem(last=False)[1]
            self.lists_bytes -= old_rows.nbytes + old_freqs.nbytes
        return rows, freqs

    def changed_postings(self, token: str, weight: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """The changed rows holding ``token`` now, and its column-weighted frequency in each."""
        if not len(self.changed_ids):
            return np.zeros(0, np.int64), np.zeros(0)
        rows: dict[int, float] = {}
        for doc, col in self.index.execute("SELECT doc, col FROM changed_terms WHERE term = ?", (token,)):
            rows[doc] = rows.get(doc, 0.0) + weight[col]
        ids = np.array(sorted(rows), np.int64)
        return ids, np.array([rows[i] for i in ids.tolist()], np.float64)

    def unchanged(self, rows: np.ndarray) -> np.ndarray:
        """Those of ``rows`` (sorted) not changed since the build."""
        if not len(self.dirty):
            return rows
        return rows[~_find(self.dirty, rows)[1]]

    def row_lengths(self, rows: np.ndarray) -> np.ndarray:
        """``rows``' lengths in tokens: the build's for unchanged rows, the copy's for changed ones."""
        inside = rows < len(self.lengths)
        length = np.zeros(len(rows), np.float64)
        length[inside] = self.lengths[rows[inside]]
        if len(self.changed_ids):
            at, hit = _find(self.changed_ids, rows)
            length[hit] = self.changed_lengths[at[hit]]
        return length


class Postings:
    """Scores a store's keyword queries from its snapshot (None where FTS5 must: see :meth:`bounded_scores`)."""

    def __init__(self, store, weights: tuple[float, ...] = BM25_WEIGHTS):
        self.store = store
        self._weight = {c: w / 2 for c, w in _weighted(["content", "tags", "context"], weights).items()}  # as bm25 weighs columns
        self._lock = threading.Lock()  # one search at a time on the in-memory copy
        self._snapshot: _Snapshot | None = None

    def bounded_scores(self, kept: list[str], aside: list[str], depth: int,
                       span: tuple[int, int] | None = None) -> list[tuple[int, float]] | None:
        """The full query's best ``depth`` among rows holding a kept word (with an id in ``span``), as ``merge``
        of FTS5's two queries returns them (``aside`` empty: FTS5's OR query of ``kept``), with no filter, tag or
        session join. None — search with FTS5 — when the store has no snapshot, more than MAX_CHANGES rows changed
        since it, a word is a phrase of several tokens, or this thread is inside a write transaction (its
        uncommitted rows are not in the changes read)."""
        with self._reading() as conn:
            state = self._current(conn)
            return None if state is None else self._scores(conn, state, kept, aside, depth, span)

    def counts(self, terms: list[str], low: int, high: int, cap: int) -> list[int | None] | None:
        """Each term's rows with an id in [``low``, ``high``], counted up to ``cap`` (what FTS5's count in
        ``bounded_bm25.count_rows`` gives), from the snapshot; None for a term FTS5 splits into several tokens, and
        None for all when the snapshot cannot answer (as :meth:`bounded_scores`)."""
        with self._reading() as conn:
            state = self._current(conn)
            if state is None:
                return None
            found: list[int | None] = []
            for term in terms:
                token = state.token(term)
                if token is None:
                    found.append(None)
                    continue
                rows, _, changed_rows, _, _ = self._postings(conn, state, token, self._weight)
                inside = int(np.searchsorted(rows, high, "right") - np.searchsorted(rows, low, "left"))
                if len(state.dirty) and len(rows):  # less the changed rows' old entries in the range
                    dirty = state.dirty[(state.dirty >= low) & (state.dirty <= high)]
                    inside -= int(np.count_nonzero(_find(rows, dirty)[1]))
                inside += int(np.count_nonzero((changed_rows >= low) & (changed_rows <= high)))
                found.append(min(inside, cap))
            return found

    @contextmanager
    def _reading(self):
        """This store's reading connection in one read transaction (every read sees one state of the database), or
        None inside this thread's write transaction, whose uncommitted rows are not in the changes read."""
        if self.store.writing:
            yield None
            return
        with self._lock, self.store.reading() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def _current(self, conn) -> _Snapshot | None:
        """The snapshot's state in RAM, synced with the changes made since it; None when there is none to use."""
        if conn is None or not exists(conn):
            self._snapshot = None
            return None
        upto = changes(conn)
        if upto > MAX_CHANGES:
            return None
        snapshot, tokenize = conn.execute("SELECT snapshot, tokenize FROM memory_postings_meta").fetchone()
        if tokenize != _tokenize(conn):
            return None  # the index was rebuilt with another tokenizer (language.set_tokenizer): its tokens differ
        state = self._snapshot
        if state is None or state.snapshot != snapshot or upto < state.synced:
            lengths, = conn.execute("SELECT lengths FROM memory_postings_meta").fetchone()
            state = self._snapshot = _Snapshot(snapshot, tokenize, lengths, self.store.driver)
        if upto > state.synced:
            state.sync(conn, upto)
        return state

    def _scores(self, conn, state: _Snapshot, kept, aside, depth, span):
        tokens = [state.token(w) for w in kept + aside]
        if any(t is None for t in tokens):
            return None
        lists = [self._postings(conn, state, t, self._weight) for t in tokens]
        totals = varints(conn.execute("SELECT block FROM memories_fts_data WHERE id = 1").fetchone()[0])
        n_row, n_token = totals[0], sum(totals[1:])
        # The rows holding a kept word, in two parts scored each from its own lists: those unchanged since the
        # build (the snapshot's lists, which still hold the changed rows' old entries: no unchanged row meets
        # them) and the changed ones (the copy's lists). A row is in one part, so it gets each phrase's term once.
        parts = [state.unchanged(_union([lists[i][0] for i in range(len(kept))])), _union([lists[i][2] for i in range(len(kept))])]
        if span is not None:
            parts = [rows[(rows >= span[0]) & (rows <= span[1])] for rows in parts]
        if not len(parts[0]) + len(parts[1]):
            return []
        avgdl = float(n_token) / float(n_row)
        scores = []
        for part, rows in enumerate(parts):
            norm = K1 * (1 - B + B * state.row_lengths(rows) / avgdl)
            score = np.zeros(len(rows))
            for snapshot_rows, snapshot_freqs, changed_rows, changed_freqs, count in lists:  # in FTS5's phrase order
                found, freq = (snapshot_rows, snapshot_freqs) if part == 0 else (changed_rows, changed_freqs)
                if not count or not len(found) or not len(rows):
                    continue  # a phrase absent from every row (or from this part) adds 0.0
                idf = math.log((n_row - count + 0.5) / (count + 0.5))
                idf = idf if idf > 0.0 else 1e-6
                # The shorter list is looked up in the longer (both sorted, without repeats: the same pairs).
                if len(found) < len(rows):
                    at, hit = _find(rows, found)
                    where, f = at[hit], freq[hit]
                else:
                    at, hit = _find(found, rows)
                    where, f = np.flatnonzero(hit), freq[at[hit]]
                score[where] += idf * ((f * (K1 + 1.0)) / (f + norm[where]))
            scores.append(score)
        rows, score = np.concatenate(parts), np.concatenate(scores)
        return [(int(rows[i]), float(score[i])) for i in _best(rows, score, depth)]

    @staticmethod
    def _postings(conn, state: _Snapshot, token: str, weight: dict[str, float]):
        """``token``'s snapshot rows (ascending, the changed rows' old entries included) and weighted frequencies,
        its changed rows holding it now and theirs, and its row count now (FTS5's, for its IDF)."""
        rows, freqs = state.snapshot_list(conn, token)
        changed_rows, changed_freqs = state.changed_postings(token, weight)
        stale = 0
        if len(state.dirty) and len(rows):  # the changed rows' old entries: the dirty ids found in the list
            stale = int(np.count_nonzero(_find(rows, state.dirty)[1]))
        return rows, freqs, changed_rows, changed_freqs, len(rows) - stale + len(changed_rows)

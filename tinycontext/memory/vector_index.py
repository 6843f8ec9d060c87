"""Exact dense search over an in-RAM copy of the stored vectors.

sqlite-vec's vec0 table ``memory_vectors`` stays the store of record, but its KNN query scans every
vector of the partition row by row: 11-55 ms at 10k vectors, ~300 ms at 100k, against under 1 ms
for one BLAS matrix-vector product over the same float32 rows (notes/bench_engine.md). So the engine
keeps one matrix per session, loaded lazily from ``memory_vectors``, and searches it exhaustively:
results are the ones vec0 gives, only faster.

The copy stays exact:

- the engine's own writes go through :meth:`VectorIndex.write`, which applies them to the copy
  once the transaction commits;
- any other change is caught by a stamp checked under the store lock before every use:
  ``PRAGMA data_version`` moves when another connection (process) commits, and the connection's
  ``total_changes`` moves on every write made on this connection outside :meth:`write` (imports,
  reindex, direct SQL). A changed stamp drops the copy; it reloads on next use. Loading goes
  through vec0, which returns rows one at a time (~20 us each: 0.2 s for 10k vectors, ~2 s for
  100k), so it pays off after a few queries, not on every one.

Sessions larger than ``max_vectors`` (the ``vector_cache_max`` setting; 0 disables the copy) are
held quantised instead, up to ``quantized_max`` vectors (``vector_quantized_max``; 0: never): per
vector 48 bytes of sign bits and 384 int8 codes with a scale, ~440 bytes against 1,536 for float32,
so a million memories take ~440 MB. A search ranks every vector by Hamming distance of the sign
bits and rescores the best PRESELECT by their int8 codes; scores are those int8 cosines (the
benchmark scripts/bench_scale.py checks the top 10 against exact search). Sessions larger still,
and searches across all sessions when they hold more than ``max_vectors``, return None and the
caller queries vec0.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from threadpoolctl import ThreadpoolController

from .store import Store

# Near-duplicate checks multiply the batch against the session in slices of at most this many
# similarities (64 MB of float32), so a 1,000-memory batch into a 100k session stays small.
NEAREST_CHUNK = 16_000_000
# Rows fetched from sqlite-vec per slice when loading.
LOAD_SLICE = 8192
# Quantised sessions: candidates kept by Hamming distance (at least; 50 per requested hit), and
# rows per slice of the Hamming scan (bounded temporaries, cache-sized).
PRESELECT = 10_000
HAMMING_SLICE = 65_536

# Products run on one BLAS thread: OpenBLAS workers keep spinning after a multi-threaded product
# and starve the ONNX query embedding that runs next (notes/design_figures.md), while a product
# this size is bound by memory bandwidth anyway.
_BLAS = ThreadpoolController().select(user_api="blas")
_BLAS_LOCK = threading.Lock()  # limit() sets a process-wide value and restores it: one at a time


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    with _BLAS_LOCK, _BLAS.limit(limits=1):
        yield


def _unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (zero rows stay zero), as vec0's cosine distance sees them."""
    vectors = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


class _Block:
    """One session's vectors: ids and unit rows, with spare capacity so appends do not copy."""

    def __init__(self, expected: int = 0):
        self.n = 0
        self._expected = expected  # rows about to be loaded: allocated at once
        self._ids = np.zeros(0, np.int64)
        self._rows = np.zeros((0, 0), np.float32)

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.n]

    @property
    def rows(self) -> np.ndarray:
        return self._rows[: self.n]

    def append(self, ids: np.ndarray, rows: np.ndarray) -> None:
        need = self.n + len(ids)
        if need > len(self._ids):
            capacity = max(need, self.n + self.n // 4, self._expected, 64)
            grown = np.zeros((capacity, rows.shape[1]), np.float32)
            if self.n:
                grown[: self.n] = self.rows
            self._rows = grown
            self._ids = np.concatenate([self.ids, np.zeros(capacity - self.n, np.int64)])
        self._ids[self.n:need] = ids
        self._rows[self.n:need] = rows
        self.n = need

    def replace(self, memory_id: int, row: np.ndarray) -> None:
        self._rows[np.flatnonzero(self.ids == memory_id)] = row

    def remove(self, memory_id: int) -> None:
        # Order does not matter (search sorts), so the last row fills the hole: O(dimensions).
        for i in np.flatnonzero(self.ids == memory_id)[::-1]:
            last = self.n - 1
            self._ids[i], self._rows[i] = self._ids[last], self._rows[last]
            self.n = last


class _QuantBlock:
    """A session held quantised: sign bits and int8 codes (one scale per row) of each vector's
    offset from a fixed centre (the mean of the first rows loaded): embeddings share a common
    direction, so the offsets spread the bits and are smaller, which makes the int8 steps finer."""

    quantized = True

    def __init__(self, expected: int = 0):
        self.n = 0
        self._expected = expected
        self.center: np.ndarray | None = None
        self._ids = np.zeros(0, np.int64)
        self._bits = np.zeros((0, 0), np.uint64)  # word-major (words x capacity): the scan runs along rows
        self._codes = np.zeros((0, 0), np.int8)
        self._scales = np.zeros(0, np.float32)

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.n]

    def signs(self, rows: np.ndarray) -> np.ndarray:
        bits = np.packbits(rows - self.center > 0, axis=-1)
        pad = (-bits.shape[-1]) % 8
        if pad:
            bits = np.concatenate([bits, np.zeros(bits.shape[:-1] + (pad,), np.uint8)], axis=-1)
        return np.ascontiguousarray(bits).view(np.uint64)

    def _quantise(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Codes of the offset from the centre: smaller values, so finer int8 steps.
        rows = rows - self.center
        scales = np.abs(rows).max(axis=1) / 127.0
        codes = np.rint(np.divide(rows, scales[:, None], out=np.zeros_like(rows), where=scales[:, None] > 0))
        return codes.astype(np.int8), scales.astype(np.float32)

    def append(self, ids: np.ndarray, rows: np.ndarray) -> None:
        if self.center is None:
            self.center = rows.mean(axis=0).astype(np.float32)
        bits = self.signs(rows)
        codes, scales = self._quantise(rows)
        need = self.n + len(ids)
        if need > len(self._ids):
            capacity = max(need, self.n + self.n // 8, self._expected, 64)

            def grow(old: np.ndarray, shape: tuple) -> np.ndarray:
                new = np.zeros((capacity, *shape), old.dtype)
                new[: self.n] = old[: self.n]
                return new
            self._ids, self._scales = grow(self._ids, ()), grow(self._scales, ())
            self._bits = grow(self._bits.T if self.n else np.zeros((0, bits.shape[1]), np.uint64), bits.shape[1:]).T.copy()
            self._codes = grow(self._codes if self.n else np.zeros((0, codes.shape[1]), np.int8), codes.shape[1:])
        sl = slice(self.n, need)
        self._ids[sl], self._bits[:, sl], self._codes[sl], self._scales[sl] = ids, bits.T, codes, scales
        self.n = need

    def replace(self, memory_id: int, row: np.ndarray) -> None:
        at = np.flatnonzero(self.ids == memory_id)
        if len(at):
            codes, scales = self._quantise(row[None, :])
            self._bits[:, at], self._codes[at], self._scales[at] = self.signs(row[None, :]).T, codes, scales

    def remove(self, memory_id: int) -> None:
        for i in np.flatnonzero(self.ids == memory_id)[::-1]:
            last = self.n - 1
            for arr in (self._ids, self._bits.T, self._codes, self._scales):
                arr[i] = arr[last]
            self.n = last

    def scores(self, query: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Cosine with the unit ``query`` from the int8 codes of the rows at ``positions``."""
        return (self._codes[positions].astype(np.float32) @ query) * self._scales[positions] + float(self.center @ query)

    def candidates(self, query: np.ndarray, count: int, mask: np.ndarray | None) -> np.ndarray:
        """Row positions of about ``count`` rows most similar to the unit ``query`` by their int8
        codes, among the PRESELECT (or more) nearest by Hamming distance; best first."""
        n = self.n
        if mask is not None:
            n_allowed = int(mask.sum())
            if n_allowed == 0:
                return np.zeros(0, np.int64)
        q_bits = self.signs(query[None, :])[0]
        distance = np.empty(n, np.uint16)
        for start in range(0, n, HAMMING_SLICE):
            end = min(n, start + HAMMING_SLICE)
            total = distance[start:end]
            total[:] = 0
            for word, q_word in zip(self._bits[:, start:end], q_bits):
                total += np.bitwise_count(word ^ q_word)
        if mask is not None:
            distance[~mask] = np.iinfo(np.uint16).max
            n = n_allowed
        keep = min(n, max(PRESELECT, 50 * count))
        pre = np.argpartition(distance, keep - 1)[:keep] if keep < len(distance) else np.flatnonzero(distance < np.iinfo(np.uint16).max)
        approx = self.scores(query, pre)
        count = min(count, len(pre))
        best = np.argpartition(-approx, count - 1)[:count] if count < len(pre) else np.arange(len(pre))
        return pre[best[np.argsort(-approx[best], kind="stable")]]


class VectorIndex:
    """In-RAM per-session copy of ``memory_vectors`` for exact cosine search.

    It shares the store's connection and lock: :meth:`search`, :meth:`prepare` and :meth:`write`
    take the lock, :meth:`nearest` runs inside :meth:`write`.
    """

    def __init__(self, store: Store, max_vectors: int, quantized_max: int = 0):
        self.store = store
        self.max_vectors = max_vectors
        self.quantized_max = quantized_max
        self._blocks: OrderedDict[str, _Block] = OrderedDict()  # least recently used first
        self._complete = False  # every session is loaded (recall across all sessions)
        self._stamp: tuple[int, int] | None = None
        self._pending: list[Callable[[], None]] | None = None

    @property
    def size(self) -> int:
        """Vectors held as float32 rows."""
        return sum(b.n for b in self._blocks.values() if not isinstance(b, _QuantBlock))

    @property
    def quantized_size(self) -> int:
        return sum(b.n for b in self._blocks.values() if isinstance(b, _QuantBlock))

    # -- coherence ------------------------------------------------------------------------------

    def _current_stamp(self) -> tuple[int, int]:
        conn = self.store.conn
        return conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes

    def sync(self) -> None:
        """Drop the copy if anything wrote to the database since it was last known to be current."""
        stamp = self._current_stamp()
        if stamp != self._stamp:
            self.clear()
            self._stamp = stamp

    def clear(self) -> None:
        self._blocks.clear()
        self._complete = False

    @contextmanager
    def write(self) -> Iterator:
        """The store's write transaction, with the copy synced first and the edits queued by
        :meth:`add`, :meth:`replace` and :meth:`remove` applied only once it commits. Nested in an
        open one (an import's batches), it joins it: the edits wait for the outer commit."""
        with self.store.lock:
            if self._pending is not None:
                with self.store.write() as conn:
                    yield conn
                return
            self._pending = []
            try:
                with self.store.write() as conn:
                    self.sync()
                    yield conn
                for edit in self._pending:
                    edit()
            finally:
                self._pending = None
            # Our own commit moved total_changes, and the copy now reflects it. data_version is
            # the one read inside the transaction: a later commit by another process still shows.
            self._stamp = (self._stamp[0], self.store.conn.total_changes)

    def _queue(self, edit: Callable[[], None]) -> None:
        if self._pending is None:
            raise RuntimeError("VectorIndex edits must be made inside VectorIndex.write().")
        self._pending.append(edit)

    def add(self, session: str, ids: list[int], vectors: np.ndarray) -> None:
        self._queue(lambda: self._add(session, np.asarray(ids, np.int64), _unit(vectors)))

    def replace(self, session: str, memory_id: int, vector: np.ndarray) -> None:
        self._queue(lambda: self._edit(session, lambda b: b.replace(memory_id, _unit(vector))))

    def remove(self, session: str, memory_id: int) -> None:
        self._queue(lambda: self._edit(session, lambda b: b.remove(memory_id)))

    def _add(self, session: str, ids: np.ndarray, rows: np.ndarray) -> None:
        block = self._blocks.get(session)
        if block is None:
            if not self._complete:  # not loaded: it will be read from the table, new rows included
                return
            block = self._blocks[session] = _Block()
        if isinstance(block, _QuantBlock):
            limit, size = self.quantized_max, self.quantized_size
        else:
            limit, size = self.max_vectors, self.size
        if size + len(ids) > limit:
            del self._blocks[session]
            self._complete = False
            return
        block.append(ids, rows)

    def _edit(self, session: str, change: Callable[[_Block], None]) -> None:
        block = self._blocks.get(session)
        if block is not None:
            change(block)

    # -- loading --------------------------------------------------------------------------------

    def _session(self, session: str) -> _Block | _QuantBlock | None:
        block = self._blocks.get(session)
        if block is not None:
            self._blocks.move_to_end(session)
            return block
        count = self.store.conn.execute("SELECT count(*) FROM memories WHERE session_id = ?", (session,)).fetchone()[0]
        quantized = count > self.max_vectors
        if quantized and count > self.quantized_max:
            return None
        kind = _QuantBlock if quantized else _Block
        limit = self.quantized_max if quantized else self.max_vectors
        held = lambda: self.quantized_size if quantized else self.size  # noqa: E731
        while held() + count > limit:  # evict the least recently used blocks of the same kind
            oldest = next(s for s, b in self._blocks.items() if isinstance(b, kind))
            del self._blocks[oldest]
            self._complete = False
        # Headroom for the session's next saves, so they append without copying the matrix.
        loaded = self._read(" WHERE session_id = ?", (session,), lambda _: session, expected=count + count // 8, kind=kind)
        block = self._blocks[session] = loaded.get(session) or kind()
        return block

    def _all(self) -> list[_Block] | None:
        if not self._complete:
            count = self.store.conn.execute("SELECT count(*) FROM memories").fetchone()[0]
            if count > self.max_vectors:
                return None
            # vec0 is slow to return its partition column (~10 us a row): sessions come from memories.
            session_of = dict(self.store.conn.execute("SELECT id, session_id FROM memories").fetchall()).get
            self.clear()
            self._blocks.update(self._read("", (), session_of))
            self._complete = True
        return list(self._blocks.values())

    def _read(self, where: str, params: tuple, session_of: Callable[[int], str | None], expected: int = 0,
              kind: type = _Block) -> dict[str, _Block]:
        """Blocks per session from ``memory_vectors``, fetched in slices so the raw rows never
        take more memory than one slice."""
        cursor = self.store.conn.execute("SELECT memory_id, embedding FROM memory_vectors" + where, params)
        blocks: dict[str, _Block] = {}
        while rows := cursor.fetchmany(LOAD_SLICE):
            groups: dict[str, tuple[list, list]] = {}
            for memory_id, blob in rows:
                session = session_of(memory_id)
                if session is None:  # saved by another process between the two reads: the stamp shows it
                    continue
                ids, blobs = groups.setdefault(session, ([], []))
                ids.append(memory_id)
                blobs.append(blob)
            for session, (ids, blobs) in groups.items():
                vectors = np.frombuffer(b"".join(blobs), np.float32).reshape(len(blobs), -1)
                blocks.setdefault(session, kind(expected)).append(np.asarray(ids, np.int64), _unit(vectors))
        return blocks

    # -- queries --------------------------------------------------------------------------------

    def search(self, query: np.ndarray, session: str | None, k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]] | None:
        """The k memories most similar to ``query`` as (id, cosine similarity), best first, ties by
        id; only ids in ``allowed`` when given. None when the copy cannot hold the vectors."""
        if self.max_vectors <= 0:
            return None
        with self.store.lock:
            self.sync()
            if session is None:
                blocks = self._all()
            else:
                block = self._session(session)
                blocks = None if block is None else [block]
            if blocks is None:
                return None
            q = _unit(query)
            blocks = [b for b in blocks if b.n]
            if len(blocks) == 1 and isinstance(blocks[0], _QuantBlock):
                ids, scores = self._quantized_search(blocks[0], q, k, allowed)
                allowed = None
            else:
                ids = np.concatenate([b.ids for b in blocks] or [np.zeros(0, np.int64)])
                with _one_blas_thread():
                    scores = np.concatenate([b.rows @ q for b in blocks] or [np.zeros(0, np.float32)])
        if allowed is not None:
            keep = np.isin(ids, allowed)
            ids, scores = ids[keep], scores[keep]
        k = min(k, len(ids))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k] if k < len(ids) else np.arange(len(ids))
        top = top[np.lexsort((ids[top], -scores[top]))]
        return list(zip(ids[top].tolist(), scores[top].astype(np.float64).tolist()))

    @staticmethod
    def _quantized_search(block: _QuantBlock, q: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The k best of a quantised block with their int8 scores (within ~1e-3 of the cosine).
        Exact float32 rescoring would need the rows from sqlite-vec, whose point lookups read a
        whole chunk of 1,024 vectors each: slower than the whole search."""
        mask = None if allowed is None else np.isin(block.ids, allowed)
        positions = block.candidates(q, k, mask)
        return block.ids[positions], block.scores(q, positions)

    def prepare(self, session: str) -> None:
        """Load a session before a write transaction, so the database's write lock is not held
        while its vectors are read (~20 us each through vec0)."""
        if self.max_vectors > 0:
            with self.store.lock:
                self.sync()
                self._session(session)

    def nearest(self, session: str, vectors: np.ndarray) -> list[tuple[int, float] | None] | None:
        """For each vector, the most similar stored memory of the session as (id, cosine), the
        oldest (lowest id) among equals; None when the session is empty. None instead of the list
        when the copy cannot hold the session. Call inside :meth:`write`, before the
        transaction's own inserts (they reach the copy on commit)."""
        if self.max_vectors <= 0:
            return None
        block = self._session(session)
        if block is None:
            return None
        if not block.n:
            return [None] * len(vectors)
        out: list[tuple[int, float] | None] = []
        queries = _unit(vectors)
        if isinstance(block, _QuantBlock):  # one pre-selection per vector: ~O(n) bit operations each
            for q in queries:
                ids, sims = self._quantized_search(block, q, 1, None)
                best = sims.max()
                out.append((int(ids[sims == best].min()), float(best)))
            return out
        step = max(1, NEAREST_CHUNK // block.n)
        for start in range(0, len(queries), step):
            with _one_blas_thread():
                sims = queries[start:start + step] @ block.rows.T
            best = sims.max(axis=1)
            oldest = np.where(sims == best[:, None], block.ids, np.iinfo(np.int64).max).min(axis=1)
            out += list(zip(oldest.tolist(), best.astype(np.float64).tolist()))
        return out

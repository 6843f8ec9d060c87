"""Exact dense search over an in-RAM copy of the stored vectors.

sqlite-vec's vec0 table ``memory_vectors`` stays the store of record, but its KNN query scans every
vector of the partition row by row: 11-55 ms at 10k vectors, ~300 ms at 100k, against under 1 ms
for one BLAS matrix-vector product over the same float32 rows (notes/bench_engine.md). So the engine
keeps one matrix per session, loaded lazily from ``memory_vectors``, and searches it exhaustively:
results are the ones vec0 gives, only faster. Blocks of HALF_MIN rows or more also keep a float16 copy
(half the bytes to stream, +50 % of the block's RAM) that ranks the rows first; the rows that can be
in the top k by its error bound are rescored from the float32 ones.

The copy stays exact:

- the engine's own writes go through :meth:`VectorIndex.write`, which applies them to the copy
  once the transaction commits;
- any other change is caught by a stamp checked under the store lock before every use:
  ``PRAGMA data_version`` moves when another connection (process) commits, and the connection's
  ``total_changes`` moves on every write made on this connection outside :meth:`write` (imports,
  reindex, direct SQL). A changed stamp drops the copy; it reloads on next use. Loading goes
  through vec0, which returns rows one at a time (~20 us each: 0.2 s for 10k vectors, ~2 s for
  100k), so it pays off after a few queries, not on every one.

Sessions larger than ``exact_max`` (``vector_exact_max``) or than ``max_vectors`` (the ``vector_cache_max`` setting,
which also bounds the float rows held for searches across all sessions; 0 disables the copy) are
searched in two stages over the compact codes every vector has beside it (tinycontext/memory/codes.py),
up to ``quantized_max`` vectors (``vector_quantized_max``; 0: never): the sign bits of all the
session's rows are held in RAM (48 bytes a vector at 384 dimensions, padded to 64 for the scan: 10M vectors
take ~720 MB with their ids) and scanned by Hamming distance (faiss, one thread, filters applied inside the scan as a
bitmap); the best :func:`rescore_depth` are rescored by their int8 codes, read from ``memory_codes`` by
id. Reading thousands of codes per query costs most of it (notes/bench_scale.md), so sessions up to
``codes_max`` vectors (``vector_codes_max``) also hold every code in RAM at 4 bits (``codes.nibbles``,
196 bytes a vector: half the int8 copy's RSS): those rank the candidates first, and only the best
:func:`recheck_depth` are read back as int8. Scores are the int8 cosines, within ~1e-3 of the exact ones, except
near the 10th best, where the few rows that int8 errors could put on the wrong side are rescored from vec0's
float32 vectors (:func:`_exact_border`); tests/test_vector_codes.py checks recall@10
against exact float search, scripts/bench_scale.py measures it at 100k-10M. Sessions larger still,
and searches across all sessions when they hold more than ``max_vectors``, return None and the
caller queries vec0.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import faiss
import numpy as np
from threadpoolctl import ThreadpoolController

from . import codes
from .codes import unit as _unit
from .float_block import FloatBlock, one_faiss_thread
from .store import Store, vector_blobs

# faiss scans codes of these sizes (bytes) with unrolled popcounts, others with a generic loop that is ~2x slower
# (48 bytes at 384 dimensions: 4.9 vs 2.9 ms CPU for 1M rows, notes/bench_scale.md): the held bits are padded with
# zero bytes, which add no distance, to the next of them.
SCAN_WIDTHS = (4, 8, 16, 20, 32, 64)
# Near-duplicate checks multiply the batch against the session in slices of at most this many
# similarities (64 MB of float32), so a 1,000-memory batch into a 100k session stays small.
NEAREST_CHUNK = 16_000_000
# Rows fetched per slice when loading a session (float vectors from sqlite-vec, or bits and codes): the raw rows
# of a slice are most of the load's peak RSS (65,536 rows of bits and codes: +100 MB at 1M, notes/bench_scale.md).
LOAD_SLICE = 8192
# Quantised sessions: candidates the Hamming stage keeps for int8 rescoring (at least RESCORE_MIN,
# RESCORE_PER_HIT per requested hit); chosen so that recall@10 stays near exact search at 100k-10M
# memories (the sweep: notes/bench_scale.md).
RESCORE_MIN = 4000
RESCORE_PER_HIT = 10
# With the 4-bit codes held, also at least one per RESCORE_ROWS rows searched: the true top 10's Hamming ranks grow with
# the session (at 8.5M rows 4,000 candidates lost 1.2 % of the top 10, every miss at the Hamming stage; 8,519 lost 0.3 %
# for ~2.5 ms more CPU, notes/bench_scale.md). Without them every candidate's int8 code is read from SQLite, so the
# depth stays where it is.
RESCORE_ROWS = 1000
# With the 4-bit codes in RAM, the candidates they rank best whose int8 codes are read to score them:
# at least RECHECK_MIN, RECHECK_PER_HIT per requested hit (4-bit cosines err by ~3e-3, a few hundredths at worst).
RECHECK_MIN = 200
RECHECK_PER_HIT = 2
# The int8 cosines err by up to ~1.4e-3 (1M bench_scale vectors), enough to swap near-ties across the 10th place:
# recall@10 vs exact 0.987 at 1M. So the rows that could be on the wrong side of the EXACT_TOP-th place (or of the
# last, for fewer hits) are rescored from their float32 vectors in vec0 (~0.3 ms a point look-up): a row above it
# within BORDER of the next row's score, a row below it within BORDER of its score; the others keep their int8 scores.
EXACT_TOP = 10
BORDER = 3e-3

# Products run on one BLAS thread: OpenBLAS workers keep spinning after a multi-threaded product
# and starve the ONNX query embedding that runs next (notes/design_figures.md), while a product
# this size is bound by memory bandwidth anyway.
_BLAS = ThreadpoolController().select(user_api="blas")
_BLAS_LOCK = threading.Lock()  # limit() sets a process-wide value and restores it: one at a time


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    with _BLAS_LOCK, _BLAS.limit(limits=1):
        yield


class _QuantBlock:
    """A session held as sign bits (tinycontext/memory/codes.py) for the two-stage search: every row's
    bits in RAM (48 bytes at 384 dimensions), its codes at 4 bits too when ``with_codes`` (the int8
    codes are read from ``memory_codes`` for the candidates only). Rows are in ``memory_bits`` order
    (by id) as loaded, appends after them."""

    quantized = True

    def __init__(self, expected: int = 0, centre: np.ndarray | None = None, with_codes: bool = False):
        self.n = 0
        self._expected = expected
        self.centre = centre
        self._ids = np.zeros(0, np.int64)
        self._bits = np.zeros((0, 0), np.uint8)
        self._codes = np.zeros((0, 0), np.uint8) if with_codes else None

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.n]

    def append_bits(self, ids: np.ndarray, bits: np.ndarray, packed: np.ndarray | None = None) -> None:
        """Append rows' bits and (when held) their int8 codes ``packed``, kept at 4 bits."""
        need = self.n + len(ids)
        bits = _scan_width(bits)
        if self._codes is not None:
            packed = codes.nibbles(packed)
        if need > len(self._ids):
            capacity = max(need, self.n + self.n // 8, self._expected, 64)
            self._bits = _grown(self._bits, self.n, capacity, bits.shape[1])
            if self._codes is not None:
                self._codes = _grown(self._codes, self.n, capacity, packed.shape[1])
            self._ids = np.concatenate([self.ids, np.zeros(capacity - self.n, np.int64)])
        self._ids[self.n:need], self._bits[self.n:need] = ids, bits
        if self._codes is not None:
            self._codes[self.n:need] = packed
        self.n = need

    def _codes_of(self, coded: codes.Coded) -> tuple[np.ndarray, np.ndarray | None]:
        """The bits and (when held) int8 codes of ``coded``'s rows around this block's centre: those
        stored (the centre never moves; a reindex drops the copy), computed only if they differ."""
        if self.centre is None or not np.array_equal(self.centre, coded.centre):
            bits, packed = codes.sign_bits(coded.rows, self.centre), codes.int8_codes(coded.rows, self.centre)
        else:
            bits, packed = coded.bits, coded.packed
        return bits, packed if self._codes is not None else None

    def take(self, ids: np.ndarray, coded: codes.Coded) -> None:
        self.append_bits(ids, *self._codes_of(coded))

    def replace(self, memory_id: int, coded: codes.Coded) -> None:
        at = np.flatnonzero(self.ids == memory_id)
        bits, packed = self._codes_of(coded)
        self._bits[at] = _scan_width(bits)
        if packed is not None:
            self._codes[at] = codes.nibbles(packed)

    def remove(self, memory_id: int) -> None:
        for i in np.flatnonzero(self.ids == memory_id)[::-1]:
            last = self.n - 1
            self._ids[i], self._bits[i] = self._ids[last], self._bits[last]
            if self._codes is not None:
                self._codes[i] = self._codes[last]
            self.n = last

    def nearest_bits(self, query: np.ndarray, depth: int, mask: np.ndarray | None) -> np.ndarray:
        """Positions of ``depth`` rows nearest to the unit ``query`` by Hamming distance of the sign bits
        (only rows where ``mask`` is set, skipped inside the scan), in no particular order."""
        selector = None
        if mask is not None:
            bitmap = np.packbits(mask, bitorder="little")
            selector = faiss.IDSelectorBitmap(self.n, faiss.swig_ptr(bitmap))
        distances = np.empty((1, depth), np.int32)
        positions = np.full((1, depth), -1, np.int64)
        q_bits = np.ascontiguousarray(_scan_width(codes.sign_bits(query[None, :], self.centre)))
        bits = self._bits[: self.n]
        one_faiss_thread()
        # Counting (histogram of distances, then one pass to collect) rather than a k-heap: 4,000 of ~1M rows
        # kept make the heap's inserts most of the scan (hammings_knn_hc: 4.7 vs 2.9 ms CPU at 1M, the same rows).
        faiss.hammings_knn_mc(faiss.swig_ptr(q_bits), faiss.swig_ptr(bits), 1, self.n, depth, bits.shape[1],
                              faiss.swig_ptr(distances), faiss.swig_ptr(positions), selector)
        return positions[0][positions[0] >= 0]

    def search(self, conn, query: np.ndarray, count: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """About ``count`` (id, cosine) of the rows most similar to the unit ``query``: :meth:`candidates`,
        then :meth:`rescore` on ``conn``."""
        return self.rescore(conn, self.candidates(query, count, mask), query, count)

    def candidates(self, query: np.ndarray, count: int, mask: np.ndarray | None) -> np.ndarray:
        """The ids whose int8 codes :meth:`rescore` reads for ``count`` hits, from RAM only: the
        :func:`rescore_depth` nearest by Hamming distance (only rows where ``mask`` is set, skipped
        inside the scan), or with the 4-bit codes held, the :func:`recheck_depth` of them they rank best."""
        allowed = self.n if mask is None else int(mask.sum())
        depth = min(allowed, rescore_depth(count, allowed if self._codes is not None else 0))
        if depth <= 0:
            return np.zeros(0, np.int64)
        found = self.nearest_bits(query, depth, mask)
        ids = self.ids[found]
        if self._codes is not None and len(found) > recheck_depth(count):
            with _one_blas_thread():
                coarse = codes.nibble_scores(np.take(self._codes, found, axis=0), query, self.centre)  # take: faster than [found]
            ids = ids[np.argpartition(-coarse, recheck_depth(count) - 1)[:recheck_depth(count)]]
        return np.sort(ids)  # in key order: fewer page reads

    def rescore(self, conn, ids: np.ndarray, query: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(id, cosine) of ``ids``: their int8 codes read on ``conn``, the rows near the ``count``-th
        best (at most EXACT_TOP) rescored exactly (:func:`_exact_border`)."""
        if not len(ids):
            return ids, np.zeros(0, np.float32)
        packed = dict(conn.execute("SELECT memory_id, codes FROM memory_codes WHERE memory_id IN (SELECT value FROM json_each(?))",
                                   (json.dumps(ids.tolist()),)).fetchall())
        ids = np.array([i for i in ids.tolist() if i in packed], np.int64)  # a code missing: the stamp catches that change
        if not len(ids):
            return ids, np.zeros(0, np.float32)
        matrix = np.frombuffer(b"".join(packed[i] for i in ids.tolist()), np.uint8).reshape(len(ids), -1)
        with _one_blas_thread():
            scores = codes.scores(matrix, query, self.centre)
        return ids, _exact_border(conn, ids, scores, query, min(count, EXACT_TOP))


def _exact_border(conn, ids: np.ndarray, scores: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """``scores`` with the exact cosines of the rows' stored float32 vectors where int8 errors could move a row
    across the ``k``-th place: one of the best k within BORDER of the (k + 1)-th score, or a row below within BORDER
    of the k-th (a vector missing keeps its int8 score: the stamp catches that change). Which rows are the best k is
    then exact search's (errors of at most BORDER / 2); the order among those above the border stays int8's."""
    if k <= 0 or len(ids) <= k:
        return scores  # every row is returned: which are in the top k does not depend on the scores
    kth, next_ = -np.partition(-scores, (k - 1, k))[k - 1: k + 1]
    near = np.flatnonzero(np.where(scores >= kth, scores <= next_ + BORDER, scores >= kth - BORDER))
    blobs = vector_blobs(conn, ids[near].tolist())
    for i in near.tolist():
        blob = blobs.get(int(ids[i]))
        if blob is not None:
            scores[i] = _unit(np.frombuffer(blob, np.float32)) @ query
    return scores


def _scan_width(bits: np.ndarray) -> np.ndarray:
    """``bits`` (rows of packed sign bits) padded with zero bytes to the next of SCAN_WIDTHS."""
    width = next((w for w in SCAN_WIDTHS if w >= bits.shape[1]), bits.shape[1])
    return bits if width == bits.shape[1] else np.pad(bits, ((0, 0), (0, width - bits.shape[1])))


def _grown(array: np.ndarray, n: int, capacity: int, width: int) -> np.ndarray:
    grown = np.zeros((capacity, width), array.dtype)
    if n:
        grown[:n] = array[:n]
    return grown


def rescore_depth(count: int, rows: int = 0) -> int:
    """Candidates the Hamming stage keeps for ``count`` hits among ``rows`` rows: RESCORE_MIN, RESCORE_PER_HIT each, or
    one per RESCORE_ROWS rows, whichever is most (``rows`` 0: the size does not count)."""
    return max(RESCORE_MIN, RESCORE_PER_HIT * count, rows // RESCORE_ROWS)


def recheck_depth(count: int) -> int:
    """Candidates the 4-bit codes pass on to the int8 rescoring for ``count`` hits."""
    return max(RECHECK_MIN, RECHECK_PER_HIT * count)


class VectorIndex:
    """In-RAM per-session copy of ``memory_vectors`` for exact cosine search.

    It shares the store's connection and lock: :meth:`search`, :meth:`prepare` and :meth:`write`
    take the lock (a search of a quantised session only to find its block), :meth:`nearest` runs inside :meth:`write`.
    """

    def __init__(self, store: Store, max_vectors: int, quantized_max: int = 0, codes_max: int = 0, exact_max: int | None = None):
        self.store = store
        self.max_vectors = max_vectors
        # A float scan's cost grows with every row, the two stages' hardly (notes/bench_scale.md, session 19).
        self.exact_max = max_vectors if exact_max is None else min(exact_max, max_vectors)
        self.quantized_max = quantized_max
        self.codes_max = codes_max
        self._blocks: OrderedDict[str, FloatBlock] = OrderedDict()  # least recently used first
        self._complete = False  # every session is loaded (recall across all sessions)
        self._stamp: tuple[int, int] | None = None
        self._pending: list[Callable[[], None]] | None = None
        # Held while a search scans a quantised block outside the store lock, and while edits change blocks in place.
        self._scan = threading.Lock()

    @property
    def size(self) -> int:
        """Vectors held as float32 rows."""
        return sum(b.n for b in self._blocks.values() if not isinstance(b, _QuantBlock))

    @property
    def quantized_size(self) -> int:
        return sum(b.n for b in self._blocks.values() if isinstance(b, _QuantBlock))

    # -- coherence ------------------------------------------------------------------------------

    def sync(self) -> None:
        """Drop the copy if anything wrote to the database since it was last known to be current."""
        stamp = self.store.stamp()
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
                with self._scan:
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

    def add(self, session: str, ids: list[int], coded: codes.Coded) -> None:
        """New memories' vectors, as :func:`~tinycontext.memory.store.insert_vectors` stored them: their
        unit rows and codes are taken as they are."""
        self._queue(lambda: self._add(session, np.asarray(ids, np.int64), coded))

    def replace(self, session: str, memory_id: int, coded: codes.Coded) -> None:
        self._queue(lambda: self._edit(session, lambda b: b.replace(memory_id, coded)))

    def remove(self, session: str, memory_id: int) -> None:
        self._queue(lambda: self._edit(session, lambda b: b.remove(memory_id)))

    def _add(self, session: str, ids: np.ndarray, coded: codes.Coded) -> None:
        block = self._blocks.get(session)
        if block is None:
            if not self._complete:  # not loaded: it will be read from the table, new rows included
                return
            block = self._blocks[session] = FloatBlock()
        if isinstance(block, _QuantBlock):
            limit, size = self.quantized_max, self.quantized_size
        else:
            limit, size = self.max_vectors, self.size
        if size + len(ids) > limit:
            del self._blocks[session]
            self._complete = False
            return
        block.take(ids, coded)

    def _edit(self, session: str, change: Callable[[FloatBlock], None]) -> None:
        block = self._blocks.get(session)
        if block is not None:
            change(block)

    # -- loading --------------------------------------------------------------------------------

    def _session(self, session: str) -> FloatBlock | _QuantBlock | None:
        block = self._blocks.get(session)
        if block is not None:
            self._blocks.move_to_end(session)
            return block
        count = self.store.conn.execute("SELECT count(*) FROM memories WHERE session_id = ?", (session,)).fetchone()[0]
        quantized = self.exact_max < count <= self.quantized_max
        if not quantized and count > self.max_vectors:
            return None
        kind = _QuantBlock if quantized else FloatBlock
        limit = self.quantized_max if quantized else self.max_vectors
        held = lambda: self.quantized_size if quantized else self.size  # noqa: E731
        while held() + count > limit:  # evict the least recently used blocks of the same kind
            oldest = next(s for s, b in self._blocks.items() if isinstance(b, kind))
            del self._blocks[oldest]
            self._complete = False
        # Headroom for the session's next saves, so they append without copying the matrix.
        if quantized:
            block = self._read_bits(session, expected=count + count // 8, with_codes=count <= self.codes_max)
        else:
            block = self._read(" WHERE session_id = ?", (session,), lambda _: session, expected=count + count // 8).get(session) or FloatBlock()
        self._blocks[session] = block
        return block

    def _read_bits(self, session: str, expected: int, with_codes: bool) -> _QuantBlock:
        """A session's sign bits from ``memory_bits`` (one range scan of its primary key), with their
        int8 codes from ``memory_codes`` when ``with_codes``."""
        block = _QuantBlock(expected, codes.centre(self.store.conn), with_codes)
        if with_codes:  # a code missing (another process mid-write): the row waits for the stamp to reload
            sql = ("SELECT b.memory_id, b.bits, c.codes FROM memory_bits b JOIN memory_codes c ON c.memory_id = b.memory_id "
                   "WHERE b.session_id = ? ORDER BY b.memory_id")
        else:
            sql = "SELECT memory_id, bits FROM memory_bits WHERE session_id = ?"
        cursor = self.store.conn.execute(sql, (session,))
        while rows := cursor.fetchmany(LOAD_SLICE):
            bits = np.frombuffer(b"".join(r[1] for r in rows), np.uint8).reshape(len(rows), -1)
            packed = np.frombuffer(b"".join(r[2] for r in rows), np.uint8).reshape(len(rows), -1) if with_codes else None
            block.append_bits(np.array([r[0] for r in rows], np.int64), bits, packed)
        return block

    def _all(self) -> list[FloatBlock] | None:
        if not self._complete:
            count = self.store.conn.execute("SELECT count(*) FROM memories").fetchone()[0]
            if count > self.max_vectors:
                return None
            # vec0 is slow to return its partition column (notes/design_figures.md): sessions come from memories.
            session_of = dict(self.store.conn.execute("SELECT id, session_id FROM memories").fetchall()).get
            self.clear()
            self._blocks.update(self._read("", (), session_of))
            self._complete = True
        return list(self._blocks.values())

    def _read(self, where: str, params: tuple, session_of: Callable[[int], str | None], expected: int = 0) -> dict[str, FloatBlock]:
        """Blocks per session from ``memory_vectors``, fetched in slices so the raw rows never
        take more memory than one slice."""
        cursor = self.store.conn.execute("SELECT memory_id, embedding FROM memory_vectors" + where, params)
        blocks: dict[str, FloatBlock] = {}
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
                blocks.setdefault(session, FloatBlock(expected)).append(np.asarray(ids, np.int64), _unit(vectors))
        return blocks

    # -- queries --------------------------------------------------------------------------------

    def search(self, query: np.ndarray, session: str | None, k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]] | None:
        """The k memories most similar to ``query`` as (id, cosine similarity), best first, ties by
        id; only ids in ``allowed`` when given. None when the copy cannot hold the vectors."""
        if self.max_vectors <= 0:
            return None
        quantized = None
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
                quantized = blocks[0]
            else:
                with _one_blas_thread():
                    # Filtered: every row scored, the top k is taken among the allowed ones below.
                    scored = [(b.ids, b.rows @ q) if allowed is not None else b.scores(q, min(k, b.n)) for b in blocks]
                ids = np.concatenate([i for i, _ in scored] or [np.zeros(0, np.int64)])
                scores = np.concatenate([v for _, v in scored] or [np.zeros(0, np.float32)])
        if quantized is not None:
            # Outside the store lock, which the BM25 search running beside this one and every other read and
            # write of the process take: the scan holds only the lock the copy's edits take, the reads a
            # pooled connection. Reads newer than the copy's stamp are handled as rescore handles a missing code.
            with self._scan:
                found = quantized.candidates(q, k, None if allowed is None else np.isin(quantized.ids, allowed))
            with self.store.reading() as conn:
                ids, scores = quantized.rescore(conn, found, q, k)
            allowed = None
        if allowed is not None:
            keep = np.isin(ids, allowed)
            ids, scores = ids[keep], scores[keep]
        k = min(k, len(ids))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k] if k < len(ids) else np.arange(len(ids))
        top = top[np.lexsort((ids[top], -scores[top]))]
        return list(zip(ids[top].tolist(), scores[top].astype(np.float64).tolist()))

    def vectors(self, ids: list[int]) -> dict[int, np.ndarray]:
        """The stored unit vectors of ``ids`` (re-rankers compare candidates' vectors): from the float
        copy where it holds them (one vectorised look-up per block), the rest by id from vec0 (quantised
        sessions hold codes only). Memories without a vector are absent."""
        wanted = np.asarray(ids, np.int64)
        out: dict[int, np.ndarray] = {}
        with self.store.lock:
            if self.max_vectors > 0:
                self.sync()
                for block in self._blocks.values():
                    if isinstance(block, FloatBlock) and block.n and len(out) < len(wanted):
                        at = np.flatnonzero(np.isin(block.ids, wanted))
                        out.update(zip(block.ids[at].tolist(), block.rows[at]))
            rest = [i for i in wanted.tolist() if i not in out]
            blobs = self.store.vector_blobs(rest) if rest else {}
            if blobs:
                matrix = _unit(np.frombuffer(b"".join(blobs.values()), np.float32).reshape(len(blobs), -1))
                out.update(zip(blobs, matrix))
        return out

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
        if isinstance(block, _QuantBlock):  # one two-stage search per vector: a pass over the bits each
            for q in queries:
                ids, sims = block.search(self.store.conn, q, 1, None)
                best = sims.max() if len(sims) else None
                out.append(None if best is None else (int(ids[sims == best].min()), float(best)))
            return out
        step = max(1, NEAREST_CHUNK // block.n)
        for start in range(0, len(queries), step):
            with _one_blas_thread():
                sims = queries[start:start + step] @ block.rows.T
            best = sims.max(axis=1)
            oldest = np.where(sims == best[:, None], block.ids, np.iinfo(np.int64).max).min(axis=1)
            out += list(zip(oldest.tolist(), best.astype(np.float64).tolist()))
        return out

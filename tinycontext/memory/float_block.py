"""A session's vectors as float32 rows in RAM (tinycontext/memory/vector_index.py searches them exactly), with a
float16 copy that ranks large blocks first."""

from __future__ import annotations

import faiss
import numpy as np

from . import codes

# Float blocks of at least HALF_MIN rows are ranked first from a half-precision copy (faiss, 2 bytes a value): the
# float scan is bound by memory traffic (10k rows: 1.2 ms from DRAM, 0.5 as fp16, notes/bench_scale.md, session 20).
# For unit vectors an fp16 score is within HALF_ERROR of the float one (each value rounds by at most 2^-11 of itself,
# so the sum by 2^-11 |q||x|; plus float32 summation), so every row within twice that of the k-th best fp16 score is
# rescored from its float row, and the top k is the float scan's.
HALF_MIN = 4096
HALF_ERROR = 2.0 ** -11 + 1e-4


def one_faiss_thread() -> None:
    # faiss's OpenMP workers spin between calls like OpenBLAS's (vector_index._one_blas_thread); a query is
    # one pass over the codes, bound by memory bandwidth.
    if faiss.omp_get_max_threads() != 1:
        faiss.omp_set_num_threads(1)


class FloatBlock:
    """One session's vectors: ids and unit rows, with spare capacity so appends do not copy."""

    def __init__(self, expected: int = 0):
        self.n = 0
        self._expected = expected  # rows about to be loaded: allocated at once
        self._ids = np.zeros(0, np.int64)
        self._rows = np.zeros((0, 0), np.float32)
        self._half: faiss.IndexScalarQuantizer | None = None  # fp16 copy of the first _half.ntotal rows, built on search

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

    def take(self, ids: np.ndarray, coded: codes.Coded) -> None:
        self.append(ids, coded.rows)

    def replace(self, memory_id: int, coded: codes.Coded) -> None:
        self._rows[np.flatnonzero(self.ids == memory_id)] = coded.rows[0]
        self._half = None  # rebuilt on the next search (appends only extend it)

    def remove(self, memory_id: int) -> None:
        # Order does not matter (search sorts), so the last row fills the hole: O(dimensions).
        for i in np.flatnonzero(self.ids == memory_id)[::-1]:
            last = self.n - 1
            self._ids[i], self._rows[i] = self._ids[last], self._rows[last]
            self.n = last
        self._half = None

    def scores(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, float cosines) of rows that hold this block's k best for unit ``q``: every row (small blocks), or the
        fp16 copy's best rows with those within 2 x HALF_ERROR of its k-th, rescored."""
        if self.n < HALF_MIN or not 0 < 4 * k <= self.n:  # a small block, or a k deep enough to rescore most of it
            return self.ids, self.rows @ q
        if self._half is None:
            self._half = faiss.IndexScalarQuantizer(self._rows.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        if self._half.ntotal < self.n:
            self._half.add(self._rows[self._half.ntotal: self.n])
        one_faiss_thread()
        depth = min(self.n, k + 64)
        while True:
            found, positions = (a[0] for a in self._half.search(q[None], depth))
            cut = found[k - 1] - 2 * HALF_ERROR
            if found[-1] < cut or depth == self.n:  # past the depth every fp16 score is below the cut
                break
            depth = min(self.n, 4 * depth)
        positions = np.sort(positions[found >= cut])
        return self._ids[positions], self._rows[positions] @ q

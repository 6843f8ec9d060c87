"""A bounded LRU of vectors by text, shared by every embedder backend.

A web page's units are embedded again for each budget and each call that reads it; this keeps their
vectors so an unchanged text costs a dictionary look-up, whichever backend made it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, Sequence

import numpy as np


class VectorCache:
    """Vectors by key, least recently used dropped past ``size`` (0: keep nothing). Thread-safe.

    A key is the exact text sent to the model plus a ``scope``: whatever else changes the vector for the
    same text (a server's model name and request fields). The vectors are computed outside the lock, so
    two threads missing the same text may both compute it; they get the same vector.
    """

    def __init__(self, size: int):
        self.size = int(size)
        self._vectors: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._vectors)

    def embed(self, texts: Sequence[str], dimensions: int, compute: Callable[[list[str]], np.ndarray],
              scope: Hashable = None) -> tuple[np.ndarray, int]:
        """(vectors of ``texts``, how many came from the cache); ``compute`` gets each missing text once."""
        out = np.empty((len(texts), dimensions), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                hit = self._vectors.get((scope, text))
                if hit is not None:
                    self._vectors.move_to_end((scope, text))
                    out[i] = hit
                else:
                    missing.setdefault(text, []).append(i)
        cached = len(texts) - sum(map(len, missing.values()))
        if missing:
            unique = list(missing)
            vectors = compute(unique)
            with self._lock:
                for text, vector in zip(unique, vectors):
                    out[missing[text]] = vector
                    if self.size:
                        self._vectors[(scope, text)] = vector
                        if len(self._vectors) > self.size:
                            self._vectors.popitem(last=False)
        return out, cached

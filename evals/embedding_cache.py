"""An on-disk embedding cache, so a sweep pays for each (model, text) embedding once.

A vector depends only on the model file, tokenizer, pooling, max tokens, normalisation and the
prefixed text. ``CachedEmbedder`` wraps a real :class:`tinycontext.embeddings.Embedder` and is passed
to ``MemoryEngine(config, embedder=...)``: the engine sees the same identity and vectors, only
faster on a second pass. The cache is one SQLite file per model setting (WAL, safe for the joblib
launcher's parallel workers).

Query latency must include query embedding. When a query vector comes from the disk cache, the
time it took to compute (stored with it) is added to ``replayed_ms``; the runner adds that to the
measured recall time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tinycontext.embeddings import Embedder
from tinycontext.model_hub import file_sha256


def model_key(embedder: Embedder) -> str:
    """What a vector depends on besides the text (prefixes are part of the cached text)."""
    bundle = embedder.bundle
    parts = {
        "model_sha256": bundle.sha256 or file_sha256(bundle.model_file),
        "tokenizer_sha256": file_sha256(bundle.tokenizer_file),
        "pooling": embedder.pooling,
        "max_tokens": bundle.max_tokens,
        "normalize": bundle.normalize,
        "dimensions": embedder.dimensions,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class CachedEmbedder:
    """Duck-types Embedder for MemoryEngine; vectors come from disk when the same text was seen."""

    def __init__(self, inner: Embedder, cache_dir: Path):
        self.inner = inner
        self.bundle = inner.bundle
        self.dimensions = inner.dimensions
        self.identity = inner.identity
        self.key = model_key(inner)
        path = Path(cache_dir) / "embeddings" / f"{self.key[:24]}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB NOT NULL, ms REAL NOT NULL)")
        self._lock = threading.Lock()
        self._memory: dict[str, tuple[np.ndarray, float]] = {}
        self.replayed_ms = 0.0
        self.computed = 0
        self.hits = 0

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text], "query")[0]

    def embed_documents(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        return self.embed(texts, "document", progress=progress)

    def embed(self, texts: Sequence[str], kind: str, *, progress: bool = False) -> np.ndarray:
        prefix = self.inner.query_prefix if kind == "query" else self.inner.document_prefix
        keys = [hashlib.sha256((prefix + t).encode("utf-8")).hexdigest() for t in texts]
        found = self._lookup(set(keys))
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            todo = [texts[first[k]] for k in missing]
            started = time.perf_counter()
            vectors = self.inner.embed(todo, kind, progress=progress)
            per_text_ms = (time.perf_counter() - started) * 1000 / len(todo)
            self._store(missing, vectors, per_text_ms)
            found.update({k: (v, per_text_ms) for k, v in zip(missing, vectors)})
            self.computed += len(missing)
        replayed = [found[k][1] for k in set(keys) - set(missing)]
        self.hits += len(replayed)
        if kind == "query":
            self.replayed_ms += sum(replayed)
        return np.stack([found[k][0] for k in keys]) if keys else np.zeros((0, self.dimensions), np.float32)

    def _lookup(self, keys: set[str]) -> dict[str, tuple[np.ndarray, float]]:
        with self._lock:
            found = {k: self._memory[k] for k in keys if k in self._memory}
            rest = [k for k in keys if k not in found]
            if rest:
                rows = self._conn.execute(
                    "SELECT key, vector, ms FROM vectors WHERE key IN (SELECT value FROM json_each(?))", (json.dumps(rest),)
                ).fetchall()
                for key, blob, ms in rows:
                    found[key] = self._memory[key] = (np.frombuffer(blob, dtype=np.float32).copy(), ms)
        return found

    def _store(self, keys: list[str], vectors: np.ndarray, ms: float) -> None:
        rows = [(k, np.asarray(v, dtype=np.float32).tobytes(), ms) for k, v in zip(keys, vectors)]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany("INSERT OR IGNORE INTO vectors(key, vector, ms) VALUES (?, ?, ?)", rows)
            self._conn.execute("COMMIT")
            self._memory.update({k: (np.asarray(v, dtype=np.float32), ms) for k, v in zip(keys, vectors)})

    def take_replayed_ms(self) -> float:
        """Compute time of query vectors served from the cache since the last call."""
        value, self.replayed_ms = self.replayed_ms, 0.0
        return value

"""An on-disk embedding cache, so a sweep pays for each (model, text) embedding once.

A vector depends on the model file, tokenizer, pooling, max tokens, normalisation, the prefixed
text, how the engine computes it (``VECTOR_RECIPE`` and the ONNX graph rewrites it skips) and the
onnxruntime and tokenizers releases; the cache key holds all of them, so no vector outlives what
produced it, while an edit elsewhere in the embedding module keeps the cache. ``CachedEmbedder``
wraps a real :class:`tinycontext.Embedder` and is passed to ``MemoryEngine(config, embedder=...)``:
the engine sees the same identity and vectors, only faster on a second pass. The cache is one SQLite file per model setting (WAL: safe for
parallel workers on one host's local disk, never on a network filesystem).

Vectors from here serve quality passes only. Latency is never derived from the cache: the runner
times live recalls with an uncached embedder (``evals.timing``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from tinycontext import Embedder

from .fingerprint import sha256_files



@functools.lru_cache(maxsize=64)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    return sha256_files(path)


def file_sha256(path: Path) -> str:
    """sha256 of a model file, hashed once per process while its size and mtime stay the same."""
    st = Path(path).stat()
    return _file_sha256(Path(path), st.st_size, st.st_mtime_ns)


def model_key(bundle, pooling: str | None) -> str:
    """What a vector depends on besides the text (prefixes are part of the cached text). Needs no
    loaded model, so a finished job is recognised without loading one."""
    parts = {
        "model_sha256": file_sha256(bundle.model_file),
        "tokenizer_sha256": file_sha256(bundle.tokenizer_file),
        "pooling": pooling or bundle.pooling,
        "max_tokens": bundle.max_tokens,
        "normalize": bundle.normalize,
        "dimensions": bundle.dimensions,
        "vector_recipe": Embedder.VECTOR_RECIPE,
        "disabled_optimizers": list(Embedder.DISABLED_OPTIMIZERS),
        "onnxruntime": metadata.version("onnxruntime"),
        "tokenizers": metadata.version("tokenizers"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class CachedEmbedder:
    """Duck-types Embedder for MemoryEngine; vectors come from disk when the same text was seen."""

    def __init__(self, inner, cache_dir: Path, key: str | None = None):
        """``inner``: an ONNX :class:`Embedder` (key: :func:`model_key`) or a server's embedder, whose
        ``key`` says what its vectors depend on (``evals.models.describe``)."""
        self.inner = inner
        self.dimensions = inner.dimensions
        self.identity = inner.identity
        # What the model states (its floor, fusion weights, where answers of turns end): the engine reads them from its
        # embedder when the settings leave them unset.
        for name in Embedder.STATED:
            setattr(self, name, getattr(inner, name, None))
        self.key = key or model_key(inner.bundle, inner.pooling)
        path = Path(cache_dir) / "embeddings" / f"{self.key[:24]}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        # A search embeds its queries one by one (as production does), one commit each: in WAL mode NORMAL
        # skips the fsync per commit, and a power cut can only lose the last vectors, which are recomputed.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB NOT NULL)")
        self._lock = threading.Lock()
        self._memory: dict[str, np.ndarray] = {}
        # force=true: a token naming the launch; vectors not computed under it are computed again.
        self.refresh: str | None = None
        self._computed_for: dict[str, str] = {}
        self.computed = 0
        self.hits = 0

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text], "query")[0]

    def embed_documents(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        return self.embed(texts, "document", progress=progress)

    def embed(self, texts: Sequence[str], kind: str, *, progress: bool = False) -> np.ndarray:
        prefix = self.inner.query_prefix if kind == "query" else self.inner.document_prefix
        # A vector computed on the int8 graph (Embedder.recipe) differs from the float32 one of the same
        # text; the float32 graph keeps the plain key, so vectors cached before the int8 graph stay valid.
        recipe = self.inner.recipe(kind) if hasattr(self.inner, "recipe") else ""
        keys = [hashlib.sha256((f"{recipe}\0{prefix}{t}" if recipe else prefix + t).encode("utf-8")).hexdigest() for t in texts]
        found = self._lookup(set(keys))
        if self.refresh is not None:
            found = {k: v for k, v in found.items() if self._computed_for.get(k) == self.refresh}
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        # One batch per call, each stored as soon as it is embedded: an interrupted pass over a slow server
        # keeps what it computed, and no single embedding call outlasts the server's timeout.
        chunk = max(1, int(getattr(self.inner, "batch_size", 32)))
        for start in range(0, len(missing), chunk):
            part = missing[start:start + chunk]
            vectors = self.inner.embed([texts[first[k]] for k in part], kind, progress=progress)
            self._store(part, vectors)
            self._computed_for.update(dict.fromkeys(part, self.refresh))
            found.update(zip(part, vectors))
            self.computed += len(part)
        self.hits += len(set(keys) - set(missing))
        return np.stack([found[k] for k in keys]) if keys else np.zeros((0, self.dimensions), np.float32)

    def _lookup(self, keys: set[str]) -> dict[str, np.ndarray]:
        with self._lock:
            found = {k: self._memory[k] for k in keys if k in self._memory}
            rest = [k for k in keys if k not in found]
            if rest:
                rows = self._conn.execute(
                    "SELECT key, vector FROM vectors WHERE key IN (SELECT value FROM json_each(?))", (json.dumps(rest),)
                ).fetchall()
                for key, blob in rows:
                    found[key] = self._memory[key] = np.frombuffer(blob, dtype=np.float32).copy()
        return found

    def _store(self, keys: list[str], vectors: np.ndarray) -> None:
        rows = [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in zip(keys, vectors)]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany("INSERT OR REPLACE INTO vectors(key, vector) VALUES (?, ?)", rows)
            self._conn.execute("COMMIT")
            self._memory.update({k: np.asarray(v, dtype=np.float32) for k, v in zip(keys, vectors)})

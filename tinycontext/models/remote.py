"""Embeddings from an HTTP server: OpenAI-compatible ``/v1/embeddings`` or Ollama's ``/api/embed``.

Whatever comes back is checked (JSON, one finite vector per input, the expected dimensions, the same
model) and L2-normalised, so any server's vectors behave like the bundled model's. Query and
document prefixes (e.g. e5's ``query: ``) are added to the text sent, never to what is stored.
Texts go in batches of ``embedding_batch_size``, at most ``embedding_concurrency`` requests at a
time. Connection errors, timeouts, 429 and 5xx answers are retried with exponential backoff, all
within ``embedding_timeout_s`` per call: a hung or failing server ends in ``model_unavailable``
before that deadline, and since the engine embeds before it writes, nothing is saved half-way.
Vectors are kept by text (``embedding_cache_size``, as the built-in embedder does), so a text already
embedded with the same model and role is not sent again.

The identity recorded in the database is ``<wire>:<model the server reports>`` with the dimensions
found by a probe at start-up, so pointing a database at another model is a ``model_mismatch``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from .. import telemetry
from ..errors import ConfigError, MissingExtraError, ModelMismatchError, ModelUnavailableError
from .vector_cache import VectorCache

if TYPE_CHECKING:
    from ..config import TinyContextConfig

Wire = Literal["openai", "ollama"]
PATHS = {"openai": "/v1/embeddings", "ollama": "/api/embed"}
RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
PROBE_TEXT = "dimension probe"
MAX_ERROR_CHARS = 300


def endpoint(base_url: str, wire: Wire) -> str:
    """The full embeddings URL from a server's base URL (a full endpoint URL is kept as is)."""
    url = base_url.rstrip("/")
    path = PATHS[wire]
    if url.endswith(path):
        return url
    if wire == "openai" and url.endswith("/v1"):
        return url + "/embeddings"
    return url + path


def _params(value: dict | None, role: str) -> dict:
    """Extra request fields of one role; ``model`` and ``input`` are the embedder's own."""
    params = dict(value or {})
    taken = sorted({"model", "input"} & set(params))
    if taken:
        raise ConfigError(f"embedding_{role}_params may not set {', '.join(taken)}: the embedder sends those itself.")
    return params


class RemoteEmbedder:
    """Embeds through an embedding server. Thread-safe."""

    def __init__(self, url: str, model: str, *, wire: Wire = "openai", api_key: str | None = None, timeout: float = 30.0,
                 concurrency: int = 4, batch_size: int = 32, retries: int = 3, backoff: float = 0.25,
                 query_prefix: str = "", document_prefix: str = "", dimensions: int | None = None,
                 query_params: dict | None = None, document_params: dict | None = None, min_dense: float | None = None,
                 cache_size: int = 4096):
        try:
            import httpx
        except ImportError as exc:
            raise MissingExtraError("The embedding server backends need httpx: pip install 'tinycontext[remote]'.") from exc
        if wire not in PATHS:
            raise ModelUnavailableError(f"Unknown embedding wire format {wire!r}; use openai or ollama.")
        self.url, self.wire, self.requested_model = endpoint(url, wire), wire, model
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self.batch_size = max(1, int(batch_size))
        self.query_prefix, self.document_prefix = query_prefix, document_prefix
        self.query_params, self.document_params = _params(query_params, "query"), _params(document_params, "document")
        self.min_dense = min_dense  # the relevance floor its model calls for (engine.default_min_dense)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout), headers=headers, follow_redirects=False)
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="tinycontext-embed")
        self._lock = threading.Lock()
        self._cache = VectorCache(cache_size)
        self.dimensions = dimensions or 0
        self.model: str | None = None
        # One short request learns the dimensions and the model the server really serves.
        self.dimensions = int(self._batch([PROBE_TEXT], time.monotonic() + self.timeout, self.query_params).shape[1])

    @classmethod
    def from_config(cls, config: "TinyContextConfig", *, wire: Wire) -> "RemoteEmbedder":
        if not config.embedding_url:
            raise ModelUnavailableError(f"embedding_backend={wire!r} needs embedding_url, the embedding server's address "
                                        "(e.g. http://127.0.0.1:11434 for Ollama).")
        key = config.embedding_api_key.get_secret_value() if config.embedding_api_key else None
        return cls(config.embedding_url, config.embedding_model, wire=wire, api_key=key, timeout=config.embedding_timeout_s,
                   concurrency=config.embedding_concurrency, batch_size=config.embedding_batch_size,
                   retries=config.embedding_retries, query_prefix=config.dense_query_prefix,
                   document_prefix=config.dense_document_prefix, dimensions=config.embedding_dimensions,
                   query_params=config.embedding_query_params, document_params=config.embedding_document_params,
                   min_dense=config.embedding_min_dense, cache_size=config.embedding_cache_size)

    @property
    def identity(self) -> dict:
        identity = {"model": f"{self.wire}:{self.model}", "revision": "", "dimensions": self.dimensions, "pooling": "remote",
                    "query_prefix": self.query_prefix, "document_prefix": self.document_prefix}
        # Recorded only when set, so databases built before these fields existed keep their identity.
        if self.query_params:
            identity["query_params"] = self.query_params
        if self.document_params:
            identity["document_params"] = self.document_params
        return identity

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # -- embedding --------------------------------------------------------------------------------

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text], "query")[0]

    def embed_documents(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        return self.embed(texts, "document", progress=progress)

    def embed(self, texts: Sequence[str], kind: str = "document", *, progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), np.float32)
        with telemetry.operation("embed", backend=self.wire, role=kind, model=telemetry.model_label(self.model),
                                 texts=len(texts)) as op:
            prefix = self.query_prefix if kind == "query" else self.document_prefix
            params = self.query_params if kind == "query" else self.document_params
            # A role's request fields change its vectors (e5's input_type), so they scope the cache with the model.
            scope = (self.requested_model, json.dumps(params, sort_keys=True, default=str))
            out, cached = self._cache.embed([prefix + t for t in texts], self.dimensions,
                                            lambda missing: self._send(missing, params, progress, op), scope)
            op.set(cached=cached)
            return out

    def _send(self, sent: list[str], params: dict, progress: bool, op: telemetry.Operation) -> np.ndarray:
        deadline = time.monotonic() + self.timeout
        batches = [sent[i:i + self.batch_size] for i in range(0, len(sent), self.batch_size)]
        op.set(batches=len(batches))
        if len(batches) == 1:
            return self._batch(batches[0], deadline, params)
        from tqdm.auto import tqdm

        futures = [self._pool.submit(self._batch, batch, deadline, params) for batch in batches]
        try:
            parts = [f.result() for f in tqdm(futures, desc="embedding", unit="batch", disable=not progress, leave=False)]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return np.concatenate(parts)

    def _batch(self, texts: list[str], deadline: float, params: dict) -> np.ndarray:
        body = self._post(texts, deadline, params)
        return self._vectors(body, len(texts))

    def _post(self, texts: list[str], deadline: float, params: dict) -> Any:
        import httpx

        payload = {**params, "model": self.requested_model, "input": texts}
        attempt, last = 0, ""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelUnavailableError(f"Embedding server {self.url} gave no answer within {self.timeout:g} s "
                                            f"(embedding_timeout_s){': ' + last if last else ''}.", url=self.url)
            try:
                response = self._client.post(self.url, json=payload, timeout=httpx.Timeout(left))
            except httpx.HTTPError as exc:  # refused, reset, timed out
                last = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise ModelUnavailableError(f"Embedding server {self.url} answered with something that is not JSON "
                                                    f"({response.text[:80]!r}).", url=self.url) from exc
                last = f"HTTP {response.status_code}: {response.text[:MAX_ERROR_CHARS]}"
                if response.status_code not in RETRY_STATUS:
                    raise ModelUnavailableError(f"Embedding server {self.url} refused the request ({last}). Check "
                                                f"embedding_model={self.requested_model!r} and embedding_api_key.", url=self.url)
            if attempt >= self.retries:
                raise ModelUnavailableError(f"Embedding server {self.url} failed {attempt + 1} times; last: {last}.", url=self.url)
            # Exponential backoff, never past the deadline.
            time.sleep(max(0.0, min(self.backoff * 2 ** attempt, deadline - time.monotonic())))
            attempt += 1

    def _vectors(self, body: Any, count: int) -> np.ndarray:
        try:
            if self.wire == "openai":
                rows = sorted(body["data"], key=lambda item: item.get("index", 0))
                raw = [row["embedding"] for row in rows]
            else:
                raw = body["embeddings"]
            model = body.get("model") or self.requested_model
            vectors = np.asarray(raw, dtype=np.float64)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelUnavailableError(f"Embedding server {self.url} sent an answer in an unexpected shape "
                                        f"({type(exc).__name__}: {str(exc)[:80]}); is it a {self.wire} endpoint?", url=self.url) from exc
        if vectors.ndim != 2 or len(vectors) != count:
            raise ModelUnavailableError(f"Embedding server {self.url} sent {len(vectors) if vectors.ndim else 0} vectors "
                                        f"for {count} texts.", url=self.url)
        with self._lock:
            if self.model is None:
                self.model = str(model)
            elif str(model) != self.model:
                raise ModelMismatchError(f"Embedding server {self.url} now serves model {model!r}, not {self.model!r}; "
                                         "vectors from two models cannot be mixed.", stored=self.model, configured=str(model))
        if self.dimensions and vectors.shape[1] != self.dimensions:
            raise ModelMismatchError(f"Embedding server {self.url} sent {vectors.shape[1]}-dimensional vectors; "
                                     f"this database expects {self.dimensions}.", stored=self.dimensions, configured=int(vectors.shape[1]))
        if not np.isfinite(vectors).all():
            raise ModelUnavailableError(f"Embedding server {self.url} sent NaN or infinite values.", url=self.url)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if (norms == 0).any() or not all(math.isfinite(n) for n in norms.ravel()):
            raise ModelUnavailableError(f"Embedding server {self.url} sent an all-zero vector.", url=self.url)
        return (vectors / norms).astype(np.float32)

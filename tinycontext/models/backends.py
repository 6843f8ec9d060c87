"""Embedder backends: the protocol the engine relies on, and a registry of named backends.

The engine only needs ``identity`` (what the database records about the vectors), ``dimensions``,
``embed_query(text)`` and ``embed_documents(texts, progress=)``. ``embedding_backend`` in the config
names the backend: ``onnx`` (the bundled/downloaded ONNX models, :mod:`tinycontext.models.embedder`),
``openai`` (any ``/v1/embeddings`` server: llama.cpp, vLLM, LM Studio, Ollama's v1) and ``ollama``
(Ollama's ``/api/embed``), plus any backend registered with :func:`register_backend` or published by
a package under the ``tinycontext.embedders`` entry point group (a callable taking the config and
returning an embedder), so a new backend needs no change to the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import ConfigError, ModelUnavailableError

if TYPE_CHECKING:
    from ..config import TinyContextConfig

ENTRY_POINT_GROUP = "tinycontext.embedders"
NO_MODEL = "none"  # embedding_backend for keyword-only mode
log = logging.getLogger(__name__)


@runtime_checkable
class EmbedderProtocol(Protocol):
    """What the engine needs from an embedder. Vectors are float32 rows of length ``dimensions``."""

    dimensions: int

    @property
    def identity(self) -> dict: ...

    def embed_query(self, text: str) -> np.ndarray: ...

    def embed_documents(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray: ...


Factory = Callable[["TinyContextConfig"], EmbedderProtocol]
_BACKENDS: dict[str, Factory] = {}


def register_backend(name: str, factory: Factory) -> None:
    """Make ``embedding_backend=name`` build its embedder with ``factory(config)``."""
    _BACKENDS[name] = factory


def backends() -> list[str]:
    """Registered backend names, entry points included."""
    return sorted({*_BACKENDS, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def create_embedder(config: "TinyContextConfig") -> EmbedderProtocol:
    """The embedder ``config.embedding_backend`` names, built from ``config``."""
    name = config.embedding_backend
    factory = _BACKENDS.get(name)
    if factory is None:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            raise ConfigError(f"Unknown embedding_backend {name!r}; available: {', '.join(backends())}.")
        factory = found[0].load()
    return factory(config)


def database_config(config: "TinyContextConfig", stored: dict | None, memories: int) -> "TinyContextConfig":
    """``config`` as it applies to a database holding ``memories`` memories embedded as ``stored`` records: the
    same, except that the fast tier keeps the package model an existing database was built with
    (:func:`tinycontext.models.hub.model_for_database`)."""
    if config.embedding_backend != "onnx":
        return config
    from .hub import model_for_database

    model = model_for_database(config.embedding_model, stored, memories)
    return config if model == config.embedding_model else config.model_copy(update={"embedding_model": model})


def open_embedder(config: "TinyContextConfig") -> tuple["EmbedderProtocol | None", str | None]:
    """(embedder, None), or (None, why) for keyword-only mode."""
    if config.embedding_backend == NO_MODEL:
        return None, "no embedding model configured (embedding_backend='none')"
    try:
        return create_embedder(config), None
    except ModelUnavailableError as err:
        if not config.keyword_fallback:
            raise
        log.warning("embedding model unavailable, running keyword-only: %s", err)
        return None, f"embedding model unavailable: {err.message}"


def _onnx(config: "TinyContextConfig") -> EmbedderProtocol:
    from .embedder import Embedder
    from .hub import resolve_model

    bundle = resolve_model(config.embedding_model, config.models_dir)
    return Embedder(bundle, batch_size=config.embedding_batch_size, cache_size=config.embedding_cache_size,
                    query_prefix=config.dense_query_prefix, document_prefix=config.dense_document_prefix,
                    threads=config.embedding_threads, int8_queries=config.embedding_int8_queries,
                    int8_documents=config.embedding_int8_documents,
                    outlier_documents=config.embedding_outlier_documents)


def _remote(wire: str) -> Factory:
    def build(config: "TinyContextConfig") -> EmbedderProtocol:
        from .remote import RemoteEmbedder

        return RemoteEmbedder.from_config(config, wire=wire)

    return build


register_backend("onnx", _onnx)
register_backend("openai", _remote("openai"))
register_backend("ollama", _remote("ollama"))

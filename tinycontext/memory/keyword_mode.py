"""Keyword-only mode: the engine without an embedding model, and vectors filled in once one appears.

With ``embedding_backend="none"``, or when the model cannot be loaded and ``keyword_fallback`` allows
it, the engine runs on SQLite FTS5 (BM25) alone: saving stores no vectors, recall ranks by BM25 and
says ``mode: keyword``, ``doctor`` and the MCP instructions say so too. Memories saved meanwhile
have no vector; :func:`backfill` embeds exactly those once a model is configured again
(``tinycontext reindex``, or ``reindex="auto"``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..retrieval import conversation
from ..models import backends
from ..models.backends import NO_MODEL
from .store import insert_vectors

if TYPE_CHECKING:
    from ..config import TinyContextConfig
    from ..models.backends import EmbedderProtocol
    from .store import Store

log = logging.getLogger(__name__)
BACKFILL_BATCH = 512


def open_embedder(store: "Store", config: "TinyContextConfig", *, convert: bool = False
                  ) -> tuple["TinyContextConfig", "EmbedderProtocol | None", str | None]:
    """(the settings used, the embedder or None, why None) for ``store``: ``config``, except that the fast tier keeps
    the package model a database with memories was built with (backends.database_config); ``convert`` (reindex):
    the model the settings name for a new database."""
    stored, memories = (None, 0) if convert else (store.stored_identity(), store.count_memories())
    settings = backends.database_config(config, stored, memories)
    return (settings, *backends.open_embedder(settings))


def bind(store: "Store", config: "TinyContextConfig", embedder: "EmbedderProtocol | None", *,
         convert: bool = False) -> tuple["EmbedderProtocol | None", int]:
    """Make the stored vectors fit ``embedder`` (None: keyword-only); the embedder to use and how many
    memories were embedded.

    An embedder that can embed documents on more than one graph (``documents_like``: the built-in
    model's float32 and int8 graphs) keeps the one the database's vectors came from, so no database
    is re-embedded for it; ``convert`` re-embeds onto the configured one instead (`tinycontext reindex`).
    Raises model_mismatch when the database was built by another model and ``config.reindex`` is not
    'auto' (``convert``: always 'auto'). With 'auto', memories saved while no model was available get
    their vectors too."""
    if embedder is None:
        ensure_vector_table(store)
        return None, 0
    follow = getattr(embedder, "documents_like", None)
    if follow is not None:
        embedder = follow(None if convert else store.stored_identity())
    reindex = "auto" if convert else config.reindex
    embedded = store.bind_embedder(embedder.identity, reindex=reindex,
                                   embed_all=lambda texts: embedder.embed_documents(texts, progress=True))
    if reindex == "auto":
        embedded += backfill(store, embedder)
    return embedder, embedded


def instructions_note(config: "TinyContextConfig") -> str:
    """What an agent should know when recall may run on keywords alone (MCP server instructions)."""
    advice = ("recall matches words, not meaning: query with the exact terms a memory would contain, and retry "
              "with synonyms before concluding nothing is stored.")
    if config.embedding_backend == NO_MODEL:
        return " This memory runs keyword-only (no embedding model): " + advice
    if config.keyword_fallback:
        return " If recall results say mode 'keyword', the embedding model is unavailable and " + advice
    return ""


def ensure_vector_table(store: "Store") -> None:
    """A database that never had a model gets an empty plain table in place of the vec0 one, so
    counts and deletes work; binding a model later replaces it with vectors for everything."""
    if not store.has_vector_table():
        with store.write() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS memory_vectors (memory_id INTEGER PRIMARY KEY, session_id TEXT, embedding BLOB)")


def missing_vectors(store: "Store") -> int:
    return store.read("SELECT count(*) FROM memories WHERE id NOT IN (SELECT memory_id FROM memory_vectors)")[0][0]


def backfill(store: "Store", embedder: "EmbedderProtocol") -> int:
    """Embed the memories that have no vector (saved keyword-only); returns how many."""
    total = 0
    while True:
        rows = store.read(f"SELECT id, session_id, {conversation.EMBEDDING_COLUMNS} FROM memories "
                          "WHERE id NOT IN (SELECT memory_id FROM memory_vectors) ORDER BY id LIMIT ?", (BACKFILL_BATCH,))
        if not rows:
            return total
        texts = [conversation.stored_embedding_text(*r[2:]) for r in rows]
        vectors = np.asarray(embedder.embed_documents(texts, progress=True), np.float32)
        with store.write() as conn:
            # The memory may have been deleted or embedded by another process meanwhile.
            todo = [i for i, (memory_id, *_) in enumerate(rows)
                    if conn.execute("SELECT 1 FROM memories WHERE id = ?", (memory_id,)).fetchone()
                    and not conn.execute("SELECT 1 FROM memory_vectors WHERE memory_id = ?", (memory_id,)).fetchone()]
            insert_vectors(conn, [rows[i][0] for i in todo], [rows[i][1] for i in todo], vectors[todo])
            total += len(todo)

"""An embedder's identity: what a database records about the vectors it holds (models/embedder.py,
models/remote.py make them; memory/store.py compares them)."""

from __future__ import annotations

# The key naming the graph documents were embedded on (models/embedder.py); absent: the float32 graph.
DOCUMENT_GRAPH = "document_graph"


def same_embedder(stored: dict | None, identity: dict) -> bool:
    """Whether vectors recorded under ``stored`` are ``identity``'s. Facts recorded only by newer
    versions (the model file's sha256, max_tokens) may be missing from ``stored``: what it has must match.
    A missing document graph is not one of them: it means the float32 graph."""
    return (stored is not None and set(stored) <= set(identity) and all(stored[k] == identity[k] for k in stored)
            and stored.get(DOCUMENT_GRAPH) == identity.get(DOCUMENT_GRAPH))

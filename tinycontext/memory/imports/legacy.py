"""Legacy TinyContext (tinysuite-context 0.4/0.5) SQLite databases, read read-only.

Their text ids do not fit TinyContext's integer ids, so each memory gets a new id and keeps the old
one in ``metadata.legacy_id``; sessions and dates are kept; superseded rows (0.5's lifecycle) become
the history of the memory that replaced them.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Iterator

import numpy as np

from ..engine import MemoryEngine
from ..store import LEGACY_SIGNATURE
from ...errors import InvalidInputError, StorageError
from ...models.hub import REGISTRY
from .base import Pending, check_time, decode_vector


def _vector_ok(key: str | None, dims: int | None, identity: dict) -> bool:
    """Legacy vectors are keyed ``backend:repo_id:document-prefix:<sha256[:12]>``; they are reusable
    only when the target embedder is the same hub model with the same document prefix."""
    if not key or dims != identity["dimensions"]:
        return False
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != "onnx" or parts[2] != "document-prefix":
        return False
    entry = REGISTRY.get(identity["model"])
    prefix = hashlib.sha256(identity["document_prefix"].encode("utf-8")).hexdigest()[:12]
    return entry is not None and parts[1] == entry.repo_id and parts[3] == prefix


def read(engine: MemoryEngine, path: Path, session_id: str | None = None) -> Iterator[Pending]:
    """The database's memories (``session_id`` is not used: legacy rows name their own session)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
    except sqlite3.Error as exc:
        raise StorageError(f"Cannot read {path} as a SQLite database: {exc}.") from exc
    if not LEGACY_SIGNATURE <= columns or "content_hash" in columns:
        conn.close()
        raise InvalidInputError(
            f"{path} is a SQLite file but not a legacy TinyContext database (needs memories(id, session_id, content, created_at)). "
            "To copy a TinyContext database, use `tinycontext export` on it and import the JSONL; for an mcp-memory-service "
            "database, use --format mcp-memory-service.")
    optional = [c for c in ("embedding", "embedding_model", "embedding_dimensions", "superseded_by", "superseded_at", "kind") if c in columns]
    select = ", ".join(["id", "session_id", "content", "created_at", *optional])
    identity = engine.embedder.identity if engine.embedder is not None else None  # None: keyword-only, no vectors
    try:
        records = [dict(zip(["id", "session_id", "content", "created_at", *optional], r))
                   for r in conn.execute(f"SELECT {select} FROM memories ORDER BY created_at, rowid")]
    finally:
        conn.close()
    by_id = {str(r["id"]): r for r in records}
    history: dict[str, list[dict]] = {}
    for r in records:
        successor, seen = r.get("superseded_by"), set()
        while successor and str(successor) in by_id and by_id[str(successor)].get("superseded_by") and successor not in seen:
            seen.add(successor)
            successor = by_id[str(successor)]["superseded_by"]
        if successor and str(successor) in by_id:
            r["_live"] = False
            history.setdefault(str(successor), []).append(r)
    for r in records:
        if r.get("_live") is False:
            continue
        where = f"{path}: memory {r['id']}"
        metadata = {"legacy_id": str(r["id"])}
        if r.get("kind"):
            metadata["kind"] = r["kind"]
        old = sorted(history.get(str(r["id"]), []), key=lambda h: h["created_at"])
        versions = [{"version": i + 1, "content": h["content"], "tags": [], "metadata": {"legacy_id": str(h["id"])},
                     "created_at": check_time(h["created_at"], "created_at", where),
                     "superseded_at": check_time(h.get("superseded_at") or r["created_at"], "superseded_at", where)}
                    for i, h in enumerate(old)]
        vector = None
        if identity and r.get("embedding") and _vector_ok(r.get("embedding_model"), r.get("embedding_dimensions"), identity):
            blob = decode_vector(r["embedding"], identity["dimensions"], where)
            vector = None if blob is None else np.frombuffer(blob, "<f4")
            norm = float(np.linalg.norm(vector)) if vector is not None else 0.0
            # Some legacy models stored unnormalised vectors; duplicate detection assumes unit length.
            vector = vector / norm if norm else None
        yield Pending(where, r["session_id"] or None, {
            "content": r["content"], "metadata": metadata, "created_at": check_time(r["created_at"], "created_at", where),
            "version": len(versions) + 1, "history": versions, "vector": None if vector is None else vector.tolist(),
            "uid": f"legacy:{r['id']}"})

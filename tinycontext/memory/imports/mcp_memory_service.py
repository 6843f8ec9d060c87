"""mcp-memory-service's SQLite database (doobidoo/mcp-memory-service, the ``sqlite_vec`` backend), read
read-only. Its ``memories`` table has ``content_hash`` (unique), ``content``, ``tags`` (comma-separated),
``memory_type``, ``metadata`` (JSON), ``created_at`` / ``updated_at`` (Unix seconds), their ``*_iso``
twins, and in newer versions ``deleted_at`` (a soft delete).

Each live row becomes a memory with its tags and dates; the metadata keeps the service's own plus
``source``, ``source_id`` (the content hash) and ``memory_type``. Soft-deleted rows are not imported.
Vectors are not copied: the content is embedded again by this database's model. The uid hashes the
content hash.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Iterator

from ..engine import MemoryEngine
from ...errors import StorageError
from .base import IGNORED, Pending, bad, check_time, epoch_time, source_uid

NAME = "mcp-memory-service"
REQUIRED = {"content_hash", "content", "tags", "memory_type", "metadata", "created_at"}
OPTIONAL = ("updated_at", "created_at_iso", "updated_at_iso", "deleted_at")


def _tags(raw, where: str) -> list[str]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str) and raw.lstrip().startswith("["):  # some versions stored a JSON list
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise bad(where, f"tags look like JSON but are not ({exc.msg}).") from exc
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list) else None
    if items is None:
        raise bad(where, "tags must be a comma-separated string.")
    return [str(t).strip() for t in items if str(t).strip()]


def _time(row: dict, key: str, where: str) -> str | None:
    if row.get(f"{key}_iso"):
        return check_time(row[f"{key}_iso"], f"{key}_iso", where)
    return None if row.get(key) is None else epoch_time(row[key], key, where)


def read(engine: MemoryEngine, path: Path, session_id: str | None = None) -> Iterator:
    where = str(path)
    if path.is_dir():
        raise bad(where, "is a folder; give mcp-memory-service's SQLite database file (sqlite_vec.db).")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
            if not REQUIRED <= columns or "sessions" in tables:
                raise bad(where, "is not an mcp-memory-service database (needs memories(content_hash, content, tags, memory_type, "
                                 "metadata, created_at)).")
            names = ["id", *sorted(REQUIRED), *[c for c in OPTIONAL if c in columns]]
            rows = [dict(zip(names, r)) for r in conn.execute(f"SELECT {', '.join(names)} FROM memories ORDER BY id")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StorageError(f"Cannot read {path} as a SQLite database: {exc}.") from exc
    for row in rows:
        here = f"{where}: memory {row['id']}"
        if row.get("deleted_at") is not None:
            yield IGNORED
            continue
        try:
            metadata = json.loads(row["metadata"]) if row["metadata"] else {}
        except json.JSONDecodeError as exc:
            raise bad(here, f"metadata is not JSON ({exc.msg}).") from exc
        if not isinstance(metadata, dict):
            raise bad(here, "metadata must be a JSON object.")
        metadata = {**metadata, "source": NAME, "source_id": row["content_hash"],
                    **({"memory_type": row["memory_type"]} if row["memory_type"] else {})}
        memory = {"content": row["content"], "tags": _tags(row["tags"], here), "metadata": metadata,
                  "uid": source_uid(NAME, row["content_hash"])}
        for key in ("created_at", "updated_at"):
            stamp = _time(row, key, here)
            if stamp is not None:
                memory[key] = stamp
        yield Pending(here, session_id, memory)

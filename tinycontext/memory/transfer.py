"""Moving memories in and out: JSONL export/import, imports from other memory tools, online backup.

Export format (one JSON object per line):

* ``{"type": "header", "format": "tinycontext-export", "format_version": 1, "embedder": {...}, ...}``
* ``{"type": "session", "id": ..., "created_at": ...}`` for every exported session
* ``{"type": "memory", "id", "session_id", "content", "tags", "metadata", "created_at", "updated_at",
  "version", "uid", "history": [...], "vector": base64 float32 | absent}``, plus ``occurred_at``, ``speaker``,
  ``attachments``, ``episode`` (conversation turns; null/empty otherwise)

Import goes through the engine's write path (:meth:`MemoryEngine.import_memories`): the same
validation and duplicate checks as saving. It keeps sessions, timestamps, history, and ids that the
target never used (others get a new id, reported in ``renumbered``). A memory's vector is reused when
the file's embedder identity equals the target's; otherwise the content is embedded again. Import
is idempotent: every memory carries a stable ``uid``, and one already present is skipped, whatever
renumbering happened (files from before uids get one derived from their record). Other tools' files
(:data:`FORMATS`, read by :mod:`tinycontext.memory.imports`) go the same way. The database is read
and written only through the store's and the engine's API: this module knows the file formats, no SQL.
"""

from __future__ import annotations

import base64
import json
import os
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from .engine import MemoryEngine
from .imports import basic_memory, legacy, mcp_memory, mcp_memory_service, mem0
from .imports.base import CHUNK, ImportReport, Pending, bad, check_time, decode_vector, integer, json_lines, run, source_uid
from ..errors import InvalidInputError, SessionNotFoundError, StorageError
from .store import Store, make_folder

FORMAT = "tinycontext-export"
FORMAT_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
__all__ = ["CHUNK", "FORMATS", "ImportReport", "backup", "export_jsonl", "import_file", "import_jsonl", "import_path", "iter_export"]


def _store(source: MemoryEngine | Store) -> Store:
    return source.store if isinstance(source, MemoryEngine) else source


# -- export ----------------------------------------------------------------------------------------


def iter_export(source: MemoryEngine | Store, *, session_id: str | None = None, vectors: bool = True) -> Iterator[dict]:
    """The export records, header first. Reads in pages so huge databases stream."""
    store = _store(source)
    if session_id is not None and not store.has_session(session_id):
        raise SessionNotFoundError(f"No session {session_id!r} to export. List sessions with `tinycontext sessions`.")
    identity = store.stored_identity()
    with_vectors = bool(vectors and identity)
    yield {"type": "header", "format": FORMAT, "format_version": FORMAT_VERSION,
           "exported_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
           "schema_version": store.schema_version, "embedder": identity, "memories": store.count_memories(session_id),
           "vectors": with_vectors}
    for sid, created in store.dump_sessions(session_id):
        yield {"type": "session", "id": sid, "created_at": created}
    for memory in store.dump_memories(session_id, vectors=with_vectors, page=CHUNK):
        memory.pop("tokens")  # depends on the target's encoding; recounted on import
        vector = memory.pop("vector", None)
        record = {"type": "memory", **memory}
        if vector is not None:
            record["vector"] = base64.b64encode(vector).decode("ascii")
        yield record


def export_jsonl(source: MemoryEngine | Store, out: IO[str], *, session_id: str | None = None, vectors: bool = True) -> int:
    """Write the export to a text stream; returns the number of memories written."""
    written = 0
    for record in iter_export(source, session_id=session_id, vectors=vectors):
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        written += record["type"] == "memory"
    return written


# -- import ----------------------------------------------------------------------------------------

# The fields each record type may carry (what iter_export writes); anything else is refused, not dropped.
HEADER_FIELDS = {"type", "format", "format_version", "exported_at", "schema_version", "embedder", "memories", "vectors"}
SESSION_FIELDS = {"type", "id", "created_at"}
MEMORY_FIELDS = {"type", "id", "session_id", "content", "tags", "metadata", "created_at", "updated_at", "version", "uid",
                 "expires_at", "history", "vector", "occurred_at", "speaker", "attachments", "episode", "valid_from", "valid_until",
                 "superseded_by"}
HISTORY_FIELDS = {"version", "content", "tags", "metadata", "created_at", "superseded_at"}


def _unknown(record: dict, allowed: set[str], what: str, where: str) -> None:
    extra = sorted(set(record) - allowed)
    if extra:
        raise bad(where, f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra[:5]))} in a {what} record "
                         f"(known: {', '.join(sorted(allowed - {'type'}))}); the file was not written by this version of `tinycontext export`.")


def _history(raw, where: str) -> list[dict]:
    if not isinstance(raw, list) or not all(isinstance(h, dict) for h in raw):
        raise bad(where, "history must be a list of earlier versions.")
    out = []
    for h in raw:
        _unknown(h, HISTORY_FIELDS, "history", where)
        if not isinstance(h.get("content"), str):
            raise bad(where, "every history entry needs its content (a string).")
        out.append({**h, "version": integer(h.get("version"), "history version", where),
                    "created_at": check_time(h.get("created_at"), "history created_at", where),
                    "superseded_at": check_time(h.get("superseded_at"), "history superseded_at", where)})
    return out


def _jsonl_rows(engine: MemoryEngine, lines: Iterable[str], source: str) -> Iterator[Pending | tuple]:
    """Parse an export; yields ("session", id, created_at, where) tuples and memories to import."""
    identity = engine.embedder.identity if engine.embedder is not None else None  # None: keyword-only, no vectors
    reuse_vectors = False
    for number, where, record in json_lines(lines, source, "expected one export record per line"):
        kind = record.get("type") if isinstance(record, dict) else None
        if number == 1 and kind != "header":
            raise bad(where, "missing export header; this file was not written by `tinycontext export` "
                             "(another tool's file? see `tinycontext import --help` for --format).")
        if kind == "header":
            if record.get("format") != FORMAT or record.get("format_version") != FORMAT_VERSION:
                raise bad(where, f"unsupported format {record.get('format')!r} v{record.get('format_version')}.")
            _unknown(record, HEADER_FIELDS, "header", where)
            reuse_vectors = identity is not None and record.get("embedder") == identity
        elif kind == "session":
            _unknown(record, SESSION_FIELDS, "session", where)
            if not isinstance(record.get("id"), str):
                raise bad(where, "a session record needs a string id.")
            yield ("session", record["id"], check_time(record.get("created_at"), "session created_at", where), where)
        elif kind == "memory":
            _unknown(record, MEMORY_FIELDS, "memory", where)
            old_id = integer(record.get("id"), "id", where)
            created = check_time(record.get("created_at"), "created_at", where)
            session = record.get("session_id")
            if session is not None and not isinstance(session, str):
                raise bad(where, f"session_id must be a string, got {str(session)[:40]}.")
            memory = {k: record[k] for k in ("content", "tags", "metadata", "occurred_at", "speaker", "attachments", "episode", "expires_at",
                                             "uid") if record.get(k) is not None}
            if record.get("updated_at") is not None:
                memory["updated_at"] = check_time(record["updated_at"], "updated_at", where)
            if record.get("version") is not None:
                memory["version"] = integer(record["version"], "version", where)
            for key in ("valid_from", "valid_until"):
                if record.get(key) is not None:
                    memory[key] = check_time(record[key], key, where)
            if record.get("superseded_by") is not None:
                memory["superseded_by"] = integer(record["superseded_by"], "superseded_by", where)
            vector = decode_vector(record.get("vector"), identity["dimensions"], where) if reuse_vectors else None
            memory.update(id=old_id, created_at=created, history=_history(record.get("history") or [], where),
                          vector=vector)
            if "uid" not in memory:
                # A memory exported before uids existed: the same file gives the same uid.
                memory["uid"] = source_uid("export", session, old_id, record.get("created_at"), record.get("content"))
            yield Pending(where, session, memory)
        else:
            raise bad(where, f"unknown record type {kind!r}.")


def import_jsonl(engine: MemoryEngine, stream: IO[str] | Iterable[str], *, source: str = "<stream>", dry_run: bool = False) -> ImportReport:
    """Import an export stream. Every memory keeps its uid, so importing the same file again adds nothing."""
    return run(engine, lambda: _jsonl_rows(engine, stream, source), ImportReport(source=source, dry_run=dry_run))


def _file_rows(engine: MemoryEngine, path: Path, session_id: str | None = None) -> Iterator[Pending | tuple]:
    try:
        with open(path, encoding="utf-8") as fh:
            yield from _jsonl_rows(engine, fh, str(path))
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path} is neither UTF-8 JSONL nor a SQLite database ({exc}).") from exc


def _tinycontext_reader(path: Path) -> Callable:
    """A TinyContext JSONL export, or a legacy TinyContext (tinysuite-context) SQLite database."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except IsADirectoryError as exc:
        raise InvalidInputError(f"{path} is a folder; a TinyContext import reads one export file.") from exc
    except OSError as exc:
        raise InvalidInputError(f"Cannot read {path}: {exc.strerror or exc}. Check the path and its permissions.") from exc
    return legacy.read if magic == SQLITE_MAGIC else _file_rows


@dataclass(frozen=True)
class Format:
    """An importable format: what it reads (for help texts) and its reader ``(engine, path, session_id)``."""

    name: str
    reads: str
    reader: Callable[[Path], Callable]  # path -> reader; TinyContext's picks JSONL or legacy SQLite by the file


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("tinycontext", "a `tinycontext export` JSONL file, or a legacy TinyContext (tinysuite-context) SQLite database",
           _tinycontext_reader),
    Format("mcp-memory", "the reference MCP memory server's memory.jsonl (entities with observations, relations)",
           lambda path: mcp_memory.read),
    Format("mem0", "a mem0 JSON export (get_all results, or OpenMemory's export zip / memories.json)", lambda path: mem0.read),
    Format("basic-memory", "a basic-memory folder of Markdown notes (frontmatter, observations, relations)", lambda path: basic_memory.read),
    Format("mcp-memory-service", "an mcp-memory-service SQLite database (sqlite_vec backend)", lambda path: mcp_memory_service.read),
)}


def import_path(engine: MemoryEngine, path: str | os.PathLike, *, format: str = "tinycontext", session_id: str | None = None,
                dry_run: bool = False) -> ImportReport:
    """Import ``path`` (a file, or a folder for basic-memory) written in ``format`` (see
    :data:`FORMATS`). Other tools' memories go into ``session_id`` (default: 'default'); a TinyContext
    export keeps its own sessions. Importing the same source twice adds nothing. ``dry_run``: count
    what would be imported and skipped, changing nothing."""
    if format not in FORMATS:
        raise InvalidInputError(f"Unknown import format {format!r}; choose one of {', '.join(FORMATS)}.")
    path = Path(path).expanduser()
    if not path.exists():
        raise InvalidInputError(f"Cannot read {path}: no such file or folder. Check the path.")
    reader = FORMATS[format].reader(path)
    return run(engine, lambda: reader(engine, path, session_id), ImportReport(source=str(path), format=format, dry_run=dry_run))


def import_file(engine: MemoryEngine, path: str | os.PathLike, *, dry_run: bool = False) -> ImportReport:
    """Import a JSONL export (streamed from disk: memory stays bounded), or a legacy TinyContext (tinysuite-context) SQLite database."""
    return import_path(engine, path, dry_run=dry_run)


def import_legacy(engine: MemoryEngine, path: str | os.PathLike, *, dry_run: bool = False) -> ImportReport:
    """Import a tinysuite-context database (see :mod:`tinycontext.memory.imports.legacy`); re-running is safe."""
    path = Path(path)
    return run(engine, lambda: legacy.read(engine, path), ImportReport(source=str(path), dry_run=dry_run))


# -- backup ----------------------------------------------------------------------------------------


def backup(source: MemoryEngine | Store, dest: str | os.PathLike, *, overwrite: bool = False) -> dict:
    """A consistent copy of the live database via SQLite's online backup API, written to a
    temporary file, checked with ``PRAGMA integrity_check``, then moved into place."""
    store = _store(source)
    dest = Path(dest).expanduser()
    if dest.exists() and not overwrite:
        raise InvalidInputError(f"{dest} already exists; choose another path or pass overwrite=True (CLI: --force).")
    if dest.resolve() == store.path.resolve():
        raise InvalidInputError("The backup path is the database itself; choose another path.")
    tmp = dest.with_name(dest.name + ".partial")
    make_folder(dest, f"the backup {dest}", "Give the backup")
    with suppress(OSError):  # a read-only folder: the connect below says so
        tmp.unlink(missing_ok=True)
    try:
        check, count = store.backup_into(tmp)
        if check != "ok":
            raise StorageError(f"The backup at {tmp} failed its integrity check ({check}); the source may be damaged.")
        os.replace(tmp, dest)
    except (StorageError, OSError) as exc:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, StorageError) and exc.message.startswith("The backup at"):
            raise
        raise StorageError(f"Backup to {dest} failed: {getattr(exc, 'message', exc)}. Check that {dest.parent} is writable "
                           "and has free space.") from exc
    return {"path": str(dest), "bytes": dest.stat().st_size, "memories": count}


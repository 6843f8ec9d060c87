"""Moving memories in and out: JSONL export/import, online backup, and import from legacy TinyContext.

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
renumbering happened (files from before uids get one derived from their record).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

import numpy as np

from .checks import check_session
from .engine import MemoryEngine
from ..errors import InvalidInputError, SessionNotFoundError, StorageError
from ..retrieval.filters import parse_time
from ..models.hub import REGISTRY
from .store import LEGACY_SIGNATURE, MEMORY_COLUMNS, Store, make_folder, now_iso, row_to_memory

FORMAT = "tinycontext-export"
FORMAT_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK = 256  # memories per write transaction on import: bounded memory, short write locks


def _store(source: MemoryEngine | Store) -> Store:
    return source.store if isinstance(source, MemoryEngine) else source


# -- export ----------------------------------------------------------------------------------------


def iter_export(source: MemoryEngine | Store, *, session_id: str | None = None, vectors: bool = True) -> Iterator[dict]:
    """The export records, header first. Reads in pages so huge databases stream."""
    store = _store(source)
    session = session_id
    if session is not None and not store.read("SELECT 1 FROM sessions WHERE id = ?", (session,)):
        raise SessionNotFoundError(f"No session {session!r} to export. List sessions with `tinycontext sessions`.")
    where, params = (" AND session_id = ?", [session]) if session else ("", [])
    identity = store.stored_identity()
    count = store.read(f"SELECT count(*) FROM memories WHERE 1{where}", params)[0][0]
    yield {"type": "header", "format": FORMAT, "format_version": FORMAT_VERSION, "exported_at": now_iso(),
           "schema_version": store.schema_version, "embedder": identity, "memories": count,
           "vectors": bool(vectors and identity)}
    session_rows = store.read(f"SELECT id, created_at FROM sessions WHERE 1{where.replace('session_id', 'id')} ORDER BY created_at, id", params)
    for sid, created in session_rows:
        yield {"type": "session", "id": sid, "created_at": created}
    last = 0
    while True:
        rows = store.read(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id > ?{where} ORDER BY id LIMIT ?",
                          [last, *params, CHUNK])
        if not rows:
            return
        ids = json.dumps([r[0] for r in rows])
        history: dict[int, list[dict]] = {}
        for r in store.read("SELECT memory_id, version, content, tags, metadata, created_at, superseded_at FROM memory_versions "
                            "WHERE memory_id IN (SELECT value FROM json_each(?)) ORDER BY memory_id, version", (ids,)):
            history.setdefault(r[0], []).append({"version": r[1], "content": r[2], "tags": json.loads(r[3]),
                                                 "metadata": json.loads(r[4]), "created_at": r[5], "superseded_at": r[6]})
        extra = {r[0]: r[1:] for r in store.read("SELECT id, uid, expires_at FROM memories WHERE id IN (SELECT value FROM json_each(?))", (ids,))}
        blobs = dict(store.read("SELECT memory_id, embedding FROM memory_vectors WHERE memory_id IN (SELECT value FROM json_each(?))",
                                (ids,))) if vectors and identity else {}
        for r in rows:
            memory = row_to_memory(r)
            memory.pop("tokens")  # depends on the target's encoding; recounted on import
            uid, expires_at = extra[memory["id"]]
            record = {"type": "memory", **memory, "uid": uid, "expires_at": expires_at, "history": history.get(memory["id"], [])}
            if memory["id"] in blobs:
                record["vector"] = base64.b64encode(blobs[memory["id"]]).decode("ascii")
            yield record
        last = rows[-1][0]


def export_jsonl(source: MemoryEngine | Store, out: IO[str], *, session_id: str | None = None, vectors: bool = True) -> int:
    """Write the export to a text stream; returns the number of memories written."""
    written = 0
    for record in iter_export(source, session_id=session_id, vectors=vectors):
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        written += record["type"] == "memory"
    return written


# -- import ----------------------------------------------------------------------------------------


@dataclass
class ImportReport:
    source: str
    imported: int = 0
    skipped: int = 0  # already present: same uid (imported before), or the same text in the session
    embedded: int = 0  # memories whose vector had to be computed
    history: int = 0  # old versions carried over
    sessions: int = 0
    renumbered: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**self.__dict__, "renumbered": {str(k): v for k, v in self.renumbered.items()}}


@dataclass
class _Pending:
    """One memory to import: where it came from (for error messages), its session, and the
    :class:`~tinycontext.memory.engine.StoredMemory` fields."""

    where: str
    session_id: str | None
    memory: dict


def _bad(where: str, message: str) -> InvalidInputError:
    return InvalidInputError(f"{where}: {message}")


def _decode_vector(raw, dims: int, where: str) -> np.ndarray | None:
    if raw is None:
        return None
    try:
        blob = base64.b64decode(raw, validate=True) if isinstance(raw, str) else bytes(raw)
    except (ValueError, TypeError) as exc:
        raise _bad(where, f"vector is not base64 ({exc}).") from exc
    if len(blob) != dims * 4:
        return None  # wrong size: treat as absent and embed again
    vector = np.frombuffer(blob, dtype="<f4").astype(np.float32)
    return vector if np.isfinite(vector).all() else None


def _stable_uid(*parts) -> str:
    """The identity of a memory exported before uids existed: the same file gives the same uid."""
    return "export:" + hashlib.sha256("\x00".join(map(str, parts)).encode("utf-8")).hexdigest()[:32]


# The fields each record type may carry (what iter_export writes); anything else is refused, not dropped.
HEADER_FIELDS = {"type", "format", "format_version", "exported_at", "schema_version", "embedder", "memories", "vectors"}
SESSION_FIELDS = {"type", "id", "created_at"}
MEMORY_FIELDS = {"type", "id", "session_id", "content", "tags", "metadata", "created_at", "updated_at", "version", "uid",
                 "expires_at", "history", "vector", "occurred_at", "speaker", "attachments", "episode"}
HISTORY_FIELDS = {"version", "content", "tags", "metadata", "created_at", "superseded_at"}
MAX_INTEGER = 2**63 - 1  # SQLite's INTEGER


def _unknown(record: dict, allowed: set[str], what: str, where: str) -> None:
    extra = sorted(set(record) - allowed)
    if extra:
        raise _bad(where, f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra[:5]))} in a {what} record "
                          f"(known: {', '.join(sorted(allowed - {'type'}))}); the file was not written by this version of `tinycontext export`.")


def _integer(value, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INTEGER:
        raise _bad(where, f"{name} must be an integer from 1 to {MAX_INTEGER}, got {str(value)[:40]}.")
    return value


def _time(value, name: str, where: str) -> str:
    """An ISO 8601 date or time, kept as written (an import copies the source's text exactly)."""
    try:
        parse_time(value, name)
    except InvalidInputError as exc:
        raise _bad(where, exc.message) from exc
    return value


def _history(raw, where: str) -> list[dict]:
    if not isinstance(raw, list) or not all(isinstance(h, dict) for h in raw):
        raise _bad(where, "history must be a list of earlier versions.")
    out = []
    for h in raw:
        _unknown(h, HISTORY_FIELDS, "history", where)
        if not isinstance(h.get("content"), str):
            raise _bad(where, "every history entry needs its content (a string).")
        out.append({**h, "version": _integer(h.get("version"), "history version", where),
                    "created_at": _time(h.get("created_at"), "history created_at", where),
                    "superseded_at": _time(h.get("superseded_at"), "history superseded_at", where)})
    return out


def _jsonl_rows(engine: MemoryEngine, lines: Iterable[str], source: str) -> Iterator[_Pending | tuple]:
    """Parse an export; yields ("session", id, created_at, where) tuples and memories to import."""
    identity = engine.embedder.identity if engine.embedder is not None else None  # None: keyword-only, no vectors
    reuse_vectors = False
    for number, line in enumerate(lines, 1):
        where = f"{source}:{number}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise _bad(where, f"not JSON ({getattr(exc, 'msg', 'nested too deeply')}); expected one export record per line.") from exc
        kind = record.get("type") if isinstance(record, dict) else None
        if number == 1 and kind != "header":
            raise _bad(where, "missing export header; this file was not written by `tinycontext export`.")
        if kind == "header":
            if record.get("format") != FORMAT or record.get("format_version") != FORMAT_VERSION:
                raise _bad(where, f"unsupported format {record.get('format')!r} v{record.get('format_version')}.")
            _unknown(record, HEADER_FIELDS, "header", where)
            reuse_vectors = identity is not None and record.get("embedder") == identity
        elif kind == "session":
            _unknown(record, SESSION_FIELDS, "session", where)
            if not isinstance(record.get("id"), str):
                raise _bad(where, "a session record needs a string id.")
            yield ("session", record["id"], _time(record.get("created_at"), "session created_at", where), where)
        elif kind == "memory":
            _unknown(record, MEMORY_FIELDS, "memory", where)
            old_id = _integer(record.get("id"), "id", where)
            created = _time(record.get("created_at"), "created_at", where)
            session = record.get("session_id")
            if session is not None and not isinstance(session, str):
                raise _bad(where, f"session_id must be a string, got {str(session)[:40]}.")
            memory = {k: record[k] for k in ("content", "tags", "metadata", "occurred_at", "speaker", "attachments", "episode", "expires_at",
                                             "uid") if record.get(k) is not None}
            if record.get("updated_at") is not None:
                memory["updated_at"] = _time(record["updated_at"], "updated_at", where)
            if record.get("version") is not None:
                memory["version"] = _integer(record["version"], "version", where)
            vector = _decode_vector(record.get("vector"), identity["dimensions"], where) if reuse_vectors else None
            memory.update(id=old_id, created_at=created, history=_history(record.get("history") or [], where),
                          vector=None if vector is None else vector.tobytes())
            memory.setdefault("uid", _stable_uid(session, old_id, record.get("created_at"), record.get("content")))
            yield _Pending(where, session, memory)
        else:
            raise _bad(where, f"unknown record type {kind!r}.")


def _check(engine: MemoryEngine, pending: _Pending) -> None:
    """The engine's own checks of one memory (content, tags, metadata, times ...), with its line."""
    try:
        engine.check_import([pending.memory])
    except InvalidInputError as exc:
        message = exc.message.removeprefix("memories[0]").removeprefix("memories are malformed: ").lstrip(".: ")
        raise _bad(pending.where, message) from exc


def _import_chunk(engine: MemoryEngine, chunk: list[_Pending], report: ImportReport) -> None:
    """Each session's memories go through the engine's write path (joining the import's transaction)."""
    by_session: dict[str | None, list[_Pending]] = {}
    for pending in chunk:
        by_session.setdefault(pending.session_id, []).append(pending)
    for session, group in by_session.items():
        try:
            result = engine.import_memories([p.memory for p in group], session_id=session)
        except InvalidInputError as exc:
            index = exc.details.get("index")
            raise _bad(group[index].where if index is not None else group[0].where, exc.message) from exc
        report.imported += len(result["ids"])
        report.skipped += len(result["skipped"])
        report.embedded += result["embedded"]
        report.renumbered.update(result["renumbered"])
        kept = {s["index"] for s in result["saved"]}
        report.history += sum(len(p.memory.get("history") or []) for i, p in enumerate(group) if i in kept)


def _run(engine: MemoryEngine, items: Callable[[], Iterable[_Pending | tuple]], report: ImportReport) -> ImportReport:
    """Check every record first (``items()`` is read twice), then write them all in one transaction:
    a bad record anywhere in a file imports nothing, and an interrupted import leaves nothing half done."""
    for item in items():
        if isinstance(item, tuple):
            try:
                check_session(item[1])
            except InvalidInputError as exc:
                raise _bad(item[3], exc.message) from exc
        else:
            _check(engine, item)
    chunk: list[_Pending] = []
    with engine.index.write():
        for item in items():
            if isinstance(item, tuple):  # a session record: make sure it exists with its original date
                try:
                    report.sessions += engine.ensure_session(item[1], created_at=item[2])
                except InvalidInputError as exc:
                    raise _bad(item[3], exc.message) from exc
                continue
            chunk.append(item)
            if len(chunk) >= CHUNK:
                _import_chunk(engine, chunk, report)
                chunk = []
        if chunk:
            _import_chunk(engine, chunk, report)
    return report


def import_jsonl(engine: MemoryEngine, stream: IO[str] | Iterable[str], *, source: str = "<stream>") -> ImportReport:
    """Import an export stream (held in memory: it is read twice, to check and to write). Every
    memory keeps its uid, so importing the same file again adds nothing."""
    lines = list(stream)
    return _run(engine, lambda: _jsonl_rows(engine, lines, source), ImportReport(source=source))


def _file_rows(engine: MemoryEngine, path: Path) -> Iterator[_Pending | tuple]:
    with open(path, encoding="utf-8") as fh:
        yield from _jsonl_rows(engine, fh, str(path))


def import_file(engine: MemoryEngine, path: str | os.PathLike) -> ImportReport:
    """Import a JSONL export (read from disk twice, to check and to write: memory stays bounded),
    or a legacy TinyContext (tinysuite-context) SQLite database."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise InvalidInputError(f"Cannot read {path}: {exc.strerror or exc}. Check the path and its permissions.") from exc
    if magic == SQLITE_MAGIC:
        return import_legacy(engine, path)
    try:
        return _run(engine, lambda: _file_rows(engine, path), ImportReport(source=str(path)))
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path} is neither UTF-8 JSONL nor a SQLite database ({exc}).") from exc


# -- legacy TinyContext (tinysuite-context 0.4/0.5) -------------------------------------------------

def _legacy_vector_ok(key: str | None, dims: int | None, identity: dict) -> bool:
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


def _legacy_rows(engine: MemoryEngine, path: Path) -> Iterator[_Pending]:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
    except sqlite3.Error as exc:
        raise StorageError(f"Cannot read {path} as a SQLite database: {exc}.") from exc
    if not LEGACY_SIGNATURE <= columns or "content_hash" in columns:
        conn.close()
        raise InvalidInputError(
            f"{path} is a SQLite file but not a legacy TinyContext database (needs memories(id, session_id, content, created_at)). "
            "To copy a TinyContext database, use `tinycontext export` on it and import the JSONL.")
    optional = [c for c in ("embedding", "embedding_model", "embedding_dimensions", "superseded_by", "superseded_at", "kind") if c in columns]
    select = ", ".join(["id", "session_id", "content", "created_at", *optional])
    identity = engine.embedder.identity if engine.embedder is not None else None  # None: keyword-only, no vectors
    try:
        records = [dict(zip(["id", "session_id", "content", "created_at", *optional], r))
                   for r in conn.execute(f"SELECT {select} FROM memories ORDER BY created_at, rowid")]
    finally:
        conn.close()
    # Superseded rows (0.5's lifecycle) become the history of the memory that replaced them.
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
                     "created_at": _time(h["created_at"], "created_at", where),
                     "superseded_at": _time(h.get("superseded_at") or r["created_at"], "superseded_at", where)}
                    for i, h in enumerate(old)]
        vector = None
        if identity and r.get("embedding") and _legacy_vector_ok(r.get("embedding_model"), r.get("embedding_dimensions"), identity):
            vector = _decode_vector(r["embedding"], identity["dimensions"], where)
            norm = float(np.linalg.norm(vector)) if vector is not None else 0.0
            # Some legacy models stored unnormalised vectors; duplicate detection assumes unit length.
            vector = vector / norm if norm else None
        yield _Pending(where, r["session_id"] or None, {
            "content": r["content"], "metadata": metadata, "created_at": _time(r["created_at"], "created_at", where), "version": len(versions) + 1,
            "history": versions, "vector": None if vector is None else vector.tolist(), "uid": f"legacy:{r['id']}"})


def import_legacy(engine: MemoryEngine, path: str | os.PathLike) -> ImportReport:
    """Import a tinysuite-context database. Its text ids do not fit TinyContext's integer ids, so
    each memory gets a new id and keeps the old one in ``metadata.legacy_id``; sessions and dates
    are kept. A memory already present in its session (same text) is skipped, so re-running is safe."""
    path = Path(path)
    report = ImportReport(source=str(path))
    return _run(engine, lambda: _legacy_rows(engine, path), report)


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
        target = store.driver.connect(str(tmp))
        try:
            with store.lock:
                store.conn.backup(target)
            # The copy is a standalone file: leave it in rollback-journal mode, not WAL.
            target.execute("PRAGMA journal_mode = DELETE")
            check = target.execute("PRAGMA integrity_check").fetchone()[0]
            count = target.execute("SELECT count(*) FROM memories").fetchone()[0]
        finally:
            target.close()
        if check != "ok":
            raise StorageError(f"The backup at {tmp} failed its integrity check ({check}); the source may be damaged.")
        os.replace(tmp, dest)
    except (store.driver.Error, OSError) as exc:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise StorageError(f"Backup to {dest} failed: {exc}. Check that {dest.parent} is writable and has free space.") from exc
    return {"path": str(dest), "bytes": dest.stat().st_size, "memories": count}


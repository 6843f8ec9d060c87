"""Moving memories in and out: JSONL export/import, online backup, and import from legacy TinyContext.

Export format (one JSON object per line):

* ``{"type": "header", "format": "tinycontext-export", "format_version": 1, "embedder": {...}, ...}``
* ``{"type": "session", "id": ..., "created_at": ...}`` for every exported session
* ``{"type": "memory", "id", "session_id", "content", "tags", "metadata", "created_at", "updated_at",
  "version", "history": [...], "vector": base64 float32 | absent}``, plus ``occurred_at``, ``speaker``,
  ``attachments``, ``episode`` (conversation turns; null/empty otherwise)

Import keeps ids, sessions, timestamps and history. A memory's vector is reused when the file's
embedder identity equals the target's; otherwise the content is embedded again. Import is
idempotent: a memory whose id already holds the same text in the same session is skipped; an id
taken by different text gets a fresh id (reported in ``renumbered``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

import numpy as np

from . import conversation
from .engine import DEFAULT_SESSION, MemoryEngine, MemoryInput, _check_session, _content_hash
from .errors import InvalidInputError, SessionNotFoundError, StorageError
from .model_hub import REGISTRY
from .store import MEMORY_COLUMNS, Store, now_iso, row_to_memory

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
    session = _check_session(session_id)
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
        blobs = dict(store.read("SELECT memory_id, embedding FROM memory_vectors WHERE memory_id IN (SELECT value FROM json_each(?))",
                                (ids,))) if vectors and identity else {}
        for r in rows:
            memory = row_to_memory(r)
            memory.pop("tokens")  # depends on the target's encoding; recounted on import
            record = {"type": "memory", **memory, "history": history.get(memory["id"], [])}
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
    skipped: int = 0  # already present (same id/text, or same text in the session for legacy files)
    embedded: int = 0  # memories whose vector had to be computed
    history: int = 0  # old versions carried over
    sessions: int = 0
    renumbered: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**self.__dict__, "renumbered": {str(k): v for k, v in self.renumbered.items()}}


@dataclass
class _Row:
    """A memory ready to insert. ``old_id``: the id to keep (exports), None to assign one (legacy)."""

    old_id: int | None
    session_id: str
    content: str
    tags: list[str]
    metadata: dict
    created_at: str
    updated_at: str | None
    version: int
    history: list[dict]
    vector: np.ndarray | None
    turn: MemoryInput | None = None  # conversation fields (speaker, occurred_at, attachments, episode)

    @property
    def indexed(self) -> str:
        """The text the vector and duplicate check use (see tinycontext/conversation.py)."""
        t = self.turn
        return self.content if t is None else conversation.embedding_text(self.content, t.speaker, t.occurred_at, t.attachments)


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


def _checked(engine: MemoryEngine, where: str, content, tags, metadata, turn: dict | None = None):
    """Validate like save() does, so imported data obeys the same limits as saved data."""
    try:
        item = engine._validate([{"content": content, "tags": tags or [], "metadata": metadata or {}, **(turn or {})}])[0]
    except InvalidInputError as exc:
        raise _bad(where, exc.message) from exc
    return item


def _jsonl_rows(engine: MemoryEngine, lines: Iterable[str], source: str) -> Iterator[_Row | tuple]:
    """Parse an export; yields ("session", id, created_at) tuples and _Row objects."""
    identity = engine.embedder.identity
    reuse_vectors = False
    for number, line in enumerate(lines, 1):
        where = f"{source}:{number}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _bad(where, f"not JSON ({exc.msg}); expected one export record per line.") from exc
        kind = record.get("type") if isinstance(record, dict) else None
        if number == 1 and kind != "header":
            raise _bad(where, "missing export header; this file was not written by `tinycontext export`.")
        if kind == "header":
            if record.get("format") != FORMAT or record.get("format_version") != FORMAT_VERSION:
                raise _bad(where, f"unsupported format {record.get('format')!r} v{record.get('format_version')}.")
            reuse_vectors = record.get("embedder") == identity
        elif kind == "session":
            sid = _check_session(record.get("id"))
            if sid is None or not isinstance(record.get("created_at"), str):
                raise _bad(where, "a session record needs string id and created_at.")
            yield ("session", sid, record["created_at"])
        elif kind == "memory":
            try:
                session = _check_session(record.get("session_id")) or DEFAULT_SESSION
                old_id = record["id"]
                created = record["created_at"]
                if isinstance(old_id, bool) or not isinstance(old_id, int) or old_id < 1 or not isinstance(created, str):
                    raise KeyError("id/created_at")
                history = record.get("history") or []
                version = int(record.get("version") or len(history) + 1)
            except (KeyError, TypeError, ValueError, InvalidInputError) as exc:
                raise _bad(where, f"a memory record needs id (positive integer), session_id and created_at ({exc}).") from exc
            turn = {k: record[k] for k in ("occurred_at", "speaker", "attachments", "episode") if record.get(k) not in (None, [])}
            item = _checked(engine, where, record.get("content"), record.get("tags"), record.get("metadata"), turn)
            for old in history:
                if not isinstance(old, dict) or not {"version", "content", "created_at", "superseded_at"} <= old.keys():
                    raise _bad(where, "each history entry needs version, content, created_at and superseded_at.")
            vector = _decode_vector(record.get("vector"), identity["dimensions"], where) if reuse_vectors else None
            yield _Row(old_id, session, item.content, item.tags, item.metadata, created, record.get("updated_at"),
                       version, history, vector, item if turn else None)
        else:
            raise _bad(where, f"unknown record type {kind!r}.")


def _existing(query, row: _Row, digest: str, keep_ids: bool) -> str:
    """'skip' if the memory is already there, 'renumber' if its id holds other text, else 'insert'."""
    if keep_ids:
        taken = query("SELECT session_id, content_hash FROM memories WHERE id = ?", (row.old_id,))
        return "insert" if taken is None else "skip" if tuple(taken) == (row.session_id, digest) else "renumber"
    found = query("SELECT 1 FROM memories WHERE session_id = ? AND content_hash = ?", (row.session_id, digest))
    return "insert" if found is None else "skip"


def _insert(engine: MemoryEngine, rows: list[_Row], report: ImportReport, *, keep_ids: bool) -> None:
    """Embed what is new and lacks a vector, then insert the chunk in one transaction (FTS via trigger)."""
    digests = [_content_hash(r.indexed) for r in rows]

    def read_one(sql, params):
        return next(iter(engine.store.read(sql, params)), None)

    todo, seen = [], set()
    for row, digest in zip(rows, digests):
        key = row.old_id if keep_ids else (row.session_id, digest)  # repeats within the chunk count as present
        if key not in seen and _existing(read_one, row, digest, keep_ids) != "skip":
            todo.append((row, digest))
        seen.add(key)
    report.skipped += len(rows) - len(todo)
    missing = [r for r, _ in todo if r.vector is None]
    if missing:
        for row, vector in zip(missing, engine.embedder.embed_documents([r.indexed for r in missing])):
            row.vector = vector
        report.embedded += len(missing)
    tokens = engine.tokens.count_many([r.content if r.turn is None else conversation.display_text(r.content, r.turn.speaker, r.turn.attachments)
                                       for r, _ in todo])
    episodes: dict[tuple[str, str], int] = {}
    with engine.store.write() as conn:

        def read_tx(sql, params):
            return conn.execute(sql, params).fetchone()

        for (row, digest), count in zip(todo, tokens):
            # Checked again inside the transaction: another writer may have added it meanwhile.
            state = _existing(read_tx, row, digest, keep_ids)
            if state == "skip":
                report.skipped += 1
                continue
            new_id = row.old_id if state == "insert" else None
            conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (row.session_id, row.created_at))
            t = row.turn or MemoryInput(content=row.content)
            episode = None
            if t.episode is not None:
                key = (row.session_id, t.episode)
                if key not in episodes:
                    conn.execute("INSERT OR IGNORE INTO episodes(session_id, key, created_at) VALUES (?, ?, ?)", (*key, row.created_at))
                    episodes[key] = conn.execute("SELECT id FROM episodes WHERE session_id = ? AND key = ?", key).fetchone()[0]
                episode = episodes[key]
            cursor = conn.execute(
                "INSERT INTO memories(id, session_id, content, tags, metadata, content_hash, tokens, created_at, updated_at, version,"
                " occurred_at, speaker, attachments, context, episode_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (new_id, row.session_id, row.content, json.dumps(row.tags, ensure_ascii=False),
                 json.dumps(row.metadata, ensure_ascii=False), digest, count, row.created_at, row.updated_at, row.version,
                 t.occurred_at, t.speaker, json.dumps(t.attachments, ensure_ascii=False),
                 conversation.search_context(t.speaker, t.occurred_at, t.attachments), episode),
            )
            mid = cursor.lastrowid
            if row.old_id is not None and mid != row.old_id:
                report.renumbered[row.old_id] = mid
            conn.executemany("INSERT OR IGNORE INTO memory_tags(memory_id, tag) VALUES (?, ?)", [(mid, t) for t in row.tags])
            conn.execute("INSERT INTO memory_vectors(memory_id, session_id, embedding) VALUES (?, ?, ?)",
                         (mid, row.session_id, np.asarray(row.vector, np.float32).tobytes()))
            conn.executemany(
                "INSERT OR REPLACE INTO memory_versions(memory_id, version, content, tags, metadata, created_at, superseded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(mid, int(h["version"]), h["content"], json.dumps(h.get("tags") or [], ensure_ascii=False),
                  json.dumps(h.get("metadata") or {}, ensure_ascii=False), h["created_at"], h["superseded_at"]) for h in row.history],
            )
            report.history += len(row.history)
            report.imported += 1
        conversation.index_episodes(conn, episodes.values())


def _run(engine: MemoryEngine, items: Iterable, report: ImportReport, *, keep_ids: bool) -> ImportReport:
    chunk: list[_Row] = []
    for item in items:
        if isinstance(item, tuple):  # a session record: make sure it exists with its original date
            with engine.store.write() as conn:
                report.sessions += conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", item[1:]).rowcount
            continue
        chunk.append(item)
        if len(chunk) >= CHUNK:
            _insert(engine, chunk, report, keep_ids=keep_ids)
            chunk = []
    if chunk:
        _insert(engine, chunk, report, keep_ids=keep_ids)
    return report


def import_jsonl(engine: MemoryEngine, stream: IO[str] | Iterable[str], *, source: str = "<stream>") -> ImportReport:
    """Import an export stream. Each chunk of memories commits on its own; re-running after an
    interruption skips what is already there."""
    report = ImportReport(source=source)
    return _run(engine, _jsonl_rows(engine, stream, source), report, keep_ids=True)


def import_file(engine: MemoryEngine, path: str | os.PathLike) -> ImportReport:
    """Import a JSONL export, or a legacy TinyContext (tinysuite-context) SQLite database."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise InvalidInputError(f"Cannot read {path}: {exc}.") from exc
    if magic == SQLITE_MAGIC:
        return import_legacy(engine, path)
    try:
        with open(path, encoding="utf-8") as fh:
            return import_jsonl(engine, fh, source=str(path))
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path} is neither UTF-8 JSONL nor a SQLite database ({exc}).") from exc


# -- legacy TinyContext (tinysuite-context 0.4/0.5) -------------------------------------------------

LEGACY_COLUMNS = {"id", "session_id", "content", "created_at"}


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


def _legacy_rows(engine: MemoryEngine, path: Path) -> Iterator[_Row]:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
    except sqlite3.Error as exc:
        raise StorageError(f"Cannot read {path} as a SQLite database: {exc}.") from exc
    if not LEGACY_COLUMNS <= columns or "content_hash" in columns:
        conn.close()
        raise InvalidInputError(
            f"{path} is a SQLite file but not a legacy TinyContext database (needs memories(id, session_id, content, created_at)). "
            "To copy a TinyContext database, use `tinycontext export` on it and import the JSONL.")
    optional = [c for c in ("embedding", "embedding_model", "embedding_dimensions", "superseded_by", "superseded_at", "kind") if c in columns]
    select = ", ".join(["id", "session_id", "content", "created_at", *optional])
    identity = engine.embedder.identity
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
        item = _checked(engine, where, r["content"], [], metadata)
        old = sorted(history.get(str(r["id"]), []), key=lambda h: h["created_at"])
        versions = [{"version": i + 1, "content": h["content"], "tags": [], "metadata": {"legacy_id": str(h["id"])},
                     "created_at": h["created_at"], "superseded_at": h.get("superseded_at") or r["created_at"]}
                    for i, h in enumerate(old)]
        vector = None
        if r.get("embedding") and _legacy_vector_ok(r.get("embedding_model"), r.get("embedding_dimensions"), identity):
            vector = _decode_vector(r["embedding"], identity["dimensions"], where)
            norm = float(np.linalg.norm(vector)) if vector is not None else 0.0
            # Some legacy models stored unnormalised vectors; duplicate detection assumes unit length.
            vector = vector / norm if norm else None
        yield _Row(None, _check_session(r["session_id"] or None) or DEFAULT_SESSION, item.content, item.tags,
                   item.metadata, str(r["created_at"]), None, len(versions) + 1, versions, vector)


def import_legacy(engine: MemoryEngine, path: str | os.PathLike) -> ImportReport:
    """Import a tinysuite-context database. Its text ids do not fit TinyContext's integer ids, so
    each memory gets a new id and keeps the old one in ``metadata.legacy_id``; sessions and dates
    are kept. A memory already present in its session (same text) is skipped, so re-running is safe."""
    path = Path(path)
    report = ImportReport(source=str(path))
    return _run(engine, _legacy_rows(engine, path), report, keep_ids=False)


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
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
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
    except store.driver.Error as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"Backup to {dest} failed: {exc}.") from exc
    return {"path": str(dest), "bytes": dest.stat().st_size, "memories": count}


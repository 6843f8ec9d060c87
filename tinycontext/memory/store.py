"""The SQLite file: schema and migrations, and the queries the engine needs (driver: :mod:`tinycontext.sqlite`)."""

from __future__ import annotations

import functools
import json
import os
import queue
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from . import codes
from ..retrieval import postings
from ..retrieval.conversation import EMBEDDING_COLUMNS, stored_embedding_text
from ..errors import ModelMismatchError, StorageError
from ..models.identity import same_embedder
from ..sqlite import sqlite_driver
from .schema import MIGRATIONS, SCHEMA_VERSION, split_sql  # noqa: F401  (MIGRATIONS: also read from here)

# What reindexing reads: each memory's id, session and the text its vector embeds (as save does).
_EMBED_ROWS = f"SELECT id, session_id, {EMBEDDING_COLUMNS} FROM memories ORDER BY id"
BUSY_TIMEOUT_MS = 10_000
# superseded_among walks the superseded rows' partial index while it holds at most this many rows per id asked
# about (an index entry checked costs a small fraction of a row looked up by id).
SUPERSEDED_WALK = 10
# The columns of tinysuite-context's memories table (transfer.import_legacy reads those databases).
LEGACY_SIGNATURE = frozenset({"id", "session_id", "content", "created_at"})


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


INSERTED_COLUMNS = ("id", "session_id", "content", "tags", "metadata", "content_hash", "tokens", "created_at", "updated_at", "version",
                    "occurred_at", "speaker", "attachments", "context", "episode_id", "expires_at", "uid", "valid_from", "valid_until",
                    "superseded_by")
# The rows travel as one JSON array of arrays: text (no NULs: the engine refuses them), integers and nulls, which JSON
# carries exactly.
_INSERT_MEMORIES = (f"INSERT INTO memories({', '.join(INSERTED_COLUMNS)}) SELECT "
                    + ", ".join(f"value ->> {i}" for i in range(len(INSERTED_COLUMNS))) + " FROM json_each(?)")


def insert_memories(conn, rows: list[tuple]) -> None:
    """Store new memories (tuples in INSERTED_COLUMNS' order) inside the caller's write transaction, in one statement:
    FTS5 writes its pending terms out as a segment at each statement that reaches it through the insert trigger, so
    row-by-row inserts wrote (and merged) one segment per memory, 2.3x the time of the whole insert
    (notes/bench_scale.md, session 20)."""
    if rows:
        conn.execute(_INSERT_MEMORIES, (json.dumps(rows, ensure_ascii=False),))


def insert_vectors(conn, ids, sessions, vectors: np.ndarray) -> codes.Coded | None:
    """Store new memories' vectors (``sessions``: one per id, or one for all) and their codes, inside
    the caller's write transaction: the one way vectors are added, so the codes always follow.
    Returns the codes written (for the in-RAM copy), None when there were no vectors."""
    if not len(ids):
        return None
    sessions = [sessions] * len(ids) if isinstance(sessions, str) else list(sessions)
    vectors = np.asarray(vectors, np.float32)
    conn.executemany("INSERT INTO memory_vectors(memory_id, session_id, embedding) VALUES (?, ?, ?)",
                     zip([int(i) for i in ids], sessions, map(bytes, vectors)))
    return codes.put(conn, ids, sessions, vectors)


def vector_blobs(conn, ids) -> dict[int, bytes]:
    """The float32 vectors (vec0 blobs) of ``ids`` that have one, by id, read on ``conn`` one id at a time: vec0 takes
    "memory_id = ?" as a point look-up (~0.2 ms at 1M rows, ~10 us for the next id in the same chunk) but scans the
    whole table for "memory_id IN (...)" (~230 ms at 1M rows, notes/bench_scale.md)."""
    found = (conn.execute("SELECT memory_id, embedding FROM memory_vectors WHERE memory_id = ?", (i,)).fetchone()
             for i in sorted({int(i) for i in ids}))
    return {row[0]: row[1] for row in found if row is not None}


MEMORY_COLUMNS = ("id, session_id, content, tags, metadata, tokens, created_at, updated_at, version, occurred_at, speaker, "
                  "attachments, (SELECT key FROM episodes WHERE episodes.id = memories.episode_id), valid_from, valid_until, superseded_by")
# Validity of facts (schema v8): in a memory's dict only when set, so current facts read as before.
VALIDITY_FIELDS = ("valid_from", "valid_until", "superseded_by")


def row_to_memory(row) -> dict:
    return {
        "id": row[0], "session_id": row[1], "content": row[2], "tags": json.loads(row[3]),
        "metadata": json.loads(row[4]), "tokens": row[5], "created_at": row[6],
        "updated_at": row[7] or row[6], "version": row[8],
        "occurred_at": row[9], "speaker": row[10], "attachments": json.loads(row[11]), "episode": row[12],
        **{k: v for k, v in zip(VALIDITY_FIELDS, row[13:16]) if v is not None},
    }


def read_memories(store: "Store", ids: list[int]) -> dict[int, dict]:
    """The memories with these ids (those that exist), by id."""
    if not ids:
        return {}
    rows = store.read(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),))
    return {r[0]: row_to_memory(r) for r in rows}


class Store:
    """One SQLite file. Writes go through one connection guarded by a lock, shared by the process's
    threads; reads (:meth:`read`) use a pool of up to ``readers`` read-only connections, which under
    WAL neither wait for each other nor for a write in progress (0: reads share the write
    connection). Other processes coordinate through WAL and ``busy_timeout``."""

    def __init__(self, path: Path | str, *, target_version: int = SCHEMA_VERSION, readers: int = 0, write_cache_mib: int = 64):
        self.path = Path(path)
        # A private in-memory database exists only on its own connection.
        self._max_readers = 0 if str(path) == ":memory:" else readers
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._readers: list = []
        self._pool_lock = threading.Lock()
        self._writing = threading.local()  # set while this thread holds a write transaction
        self.driver, self.driver_reason = sqlite_driver()
        if str(path) != ":memory:":
            self._make_folder()
            self._probe()
        try:
            self.conn = self.driver.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False, isolation_level=None)
        except self.driver.Error as exc:
            if not os.access(self.path.parent, os.W_OK):
                raise StorageError(f"Cannot open database {path}: {exc}. Its folder {self.path.parent} is not writable (a read-only "
                                   "volume or mount?): point memory_db_path (TINYCONTEXT_MEMORY_DB_PATH) at a writable place.") from exc
            raise StorageError(f"Cannot open database {path}: {exc}. Check the path and its permissions.") from exc
        self.lock = threading.RLock()
        self._bulk_cache_kib = int(write_cache_mib) * 1024
        self._bulk_depth = 0  # bulk() calls in progress, on any thread
        try:
            self._load_sqlite_vec(self.conn)
            self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._cache_size = self.conn.execute("PRAGMA cache_size").fetchone()[0]  # SQLite's default, outside bulk()
            self.migrate(target_version)
        except self.driver.Error as exc:  # e.g. the path holds something that is not a database
            self.conn.close()
            if str(path) != ":memory:" and not os.access(self.path.parent, os.W_OK):
                raise StorageError(f"Cannot use database {path}: {exc}. Its folder is not writable (a read-only volume or mount?): "
                                   "SQLite writes the database and its -wal and -shm files there.") from exc
            if isinstance(exc, self.driver.OperationalError) and "full" in str(exc):
                raise StorageError(f"Cannot use database {path}: {exc}. Free space on its disk or volume, then start again.") from exc
            raise StorageError(f"Cannot use database {path}: {exc}. Point memory_db_path at a TinyContext database or a new file.") from exc
        except BaseException:
            self.conn.close()
            raise

    def _make_folder(self) -> None:
        make_folder(self.path, f"database {self.path}", "Point memory_db_path (TINYCONTEXT_MEMORY_DB_PATH) at")
        if self.path.is_dir():
            raise StorageError(f"Cannot use database {self.path}: it is a folder. Point memory_db_path (TINYCONTEXT_MEMORY_DB_PATH) "
                               f"at a file, e.g. {self.path / 'memory.db'}.")

    def _probe(self) -> None:
        """Look at an existing file read-only before anything may write to it: switching it to WAL or
        migrating a file that is not a TinyContext database (or is newer) would change it, and a
        refused file must stay byte for byte as it was."""
        try:
            if self.path.stat().st_size == 0:
                return  # a new (or empty) file: SQLite treats it as an empty database
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"Cannot open database {self.path}: {exc.strerror}. Check the path and its permissions.") from exc
        try:
            conn = self.driver.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
            finally:
                conn.close()
        except self.driver.Error as exc:
            if not os.access(self.path.parent, os.W_OK):  # a WAL database cannot be opened, even read-only, without its -shm file
                raise StorageError(f"Cannot use database {self.path}: {exc}. Its folder is not writable (a read-only volume or mount?): "
                                   "SQLite writes the database and its -wal and -shm files there.") from exc
            raise StorageError(f"Cannot use database {self.path}: {exc}. It is damaged or not a SQLite database and was not changed: "
                               "point memory_db_path at a TinyContext database or a new file, or restore a backup.") from exc
        refused = refusal(self.path, version, tables, columns)
        if refused:
            raise StorageError(refused)

    def _load_sqlite_vec(self, conn) -> None:
        import sqlite_vec

        try:
            conn.enable_load_extension(True)
            sqlite_vec.load(conn)
            conn.enable_load_extension(False)
        except Exception as exc:
            raise StorageError(f"Cannot load the sqlite-vec extension: {exc}. Run `tinycontext doctor` for details.") from exc

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator:
        """A write transaction; BEGIN IMMEDIATE takes the write lock up front so concurrent
        writers wait on busy_timeout instead of failing with a deadlock on lock upgrade. Any failure,
        the COMMIT's included (a full disk), rolls everything back; SQLite errors become StorageError.
        Inside this thread's write transaction it joins that one: an import writes many batches, all
        or nothing."""
        with self.lock:
            if self.writing:
                try:
                    yield self.conn
                except self.driver.Error as exc:
                    raise storage_error(exc, self.path) from exc
                return
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except self.driver.Error as exc:
                raise storage_error(exc, self.path) from exc
            self._writing.active = True  # reads in the transaction must see its own changes: same connection
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException as exc:
                if self.conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
                    try:
                        self.conn.execute("ROLLBACK")
                    except self.driver.Error:
                        pass
                if isinstance(exc, self.driver.Error):
                    raise storage_error(exc, self.path) from exc
                raise
            finally:
                self._writing.active = False

    @contextmanager
    def bulk(self) -> Iterator[None]:
        """Big writes (an import, a reindex) with the write connection's page cache at ``write_cache_mib``: SQLite's 2 MB
        default spills their dirty pages to the WAL mid-transaction and reads them back (notes/bench_scale.md, session
        19). Set back when the last one ends, so the cache does not keep what reads through this connection bring in
        (the vector index's loads) for the life of the process. The lock is held only to switch it: a bulk write may
        embed for a while before it writes."""
        with self.lock:
            if not self._bulk_depth:
                self.conn.execute(f"PRAGMA cache_size = -{self._bulk_cache_kib}")
            self._bulk_depth += 1
        try:
            yield
        finally:
            with self.lock:
                self._bulk_depth -= 1
                if not self._bulk_depth:
                    self.conn.execute(f"PRAGMA cache_size = {int(self._cache_size)}")

    @property
    def writing(self) -> bool:
        """Whether this thread holds a write transaction (its changes may still roll back)."""
        return getattr(self._writing, "active", False)

    def stamp(self, wait: bool = True) -> tuple[int, int] | None:
        """A value that moves whenever the database may have changed, for copies of what it holds:
        ``PRAGMA data_version`` moves when another connection (process) commits, and the write
        connection's ``total_changes`` on every write made through it (also one rolled back). Without ``wait``,
        None instead of waiting while another thread holds the lock (a write transaction, say)."""
        if not self.lock.acquire(blocking=wait):
            return None
        try:
            return self.conn.execute("PRAGMA data_version").fetchone()[0], self.conn.total_changes
        finally:
            self.lock.release()

    @contextmanager
    def reading(self) -> Iterator:
        """A connection for reads: an idle pooled one (opened on demand up to ``readers``, else the next
        one freed), or the write connection under the lock (no pool, or inside this thread's write)."""
        if not self._max_readers or self.writing:
            with self.lock:
                yield self.conn
            return
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            with self._pool_lock:
                conn = self._open_reader() if len(self._readers) < self._max_readers else None
            if conn is None:
                conn = self._idle.get()
        try:
            yield conn
        finally:
            self._idle.put(conn)

    def _open_reader(self):
        try:
            conn = self.driver.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False, isolation_level=None)
            self._load_sqlite_vec(conn)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA query_only = ON")  # every write goes through write(), atomically
        except self.driver.Error as exc:
            raise storage_error(exc, self.path) from exc
        self._readers.append(conn)
        return conn

    def read(self, sql: str, params: Iterable = ()) -> list:
        with self.reading() as conn:
            try:
                return conn.execute(sql, tuple(params)).fetchall()
            except self.driver.Error as exc:
                raise storage_error(exc, self.path) from exc

    # -- schema ---------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return self.read("PRAGMA user_version")[0][0]

    def migrate(self, target: int = SCHEMA_VERSION) -> None:
        current = self.schema_version
        if current > SCHEMA_VERSION:
            raise StorageError(f"Database {self.path} has schema v{current}, newer than this TinyContext (v{SCHEMA_VERSION}). Upgrade tinycontext.")
        if current >= target:
            return
        # Off outside the transaction (SQLite ignores it inside one) so a table rebuild cannot cascade;
        # foreign_key_check before each commit still refuses a migration that broke a reference.
        self.conn.execute("PRAGMA foreign_keys = OFF")
        try:
            for version in range(current + 1, target + 1):
                with self.write() as conn:
                    # Re-check under the write lock: another process may have migrated meanwhile.
                    if conn.execute("PRAGMA user_version").fetchone()[0] >= version:
                        continue
                    # The postings snapshot is derived from memories_fts and rebuilt by optimize; a migration may
                    # rewrite the rows or the index under it without going through its change triggers.
                    postings.drop(conn)
                    migration = MIGRATIONS[version]
                    if callable(migration):
                        migration(conn)
                    else:
                        for statement in split_sql(migration):
                            conn.execute(statement)
                    broken = conn.execute("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise StorageError(f"Migration to schema v{version} of {self.path} would break {len(broken)} references; "
                                           "nothing was changed. Report this with the database's schema.")
                    conn.execute(f"PRAGMA user_version = {version}")
        finally:
            self.conn.execute("PRAGMA foreign_keys = ON")

    def session_span(self, session: str) -> tuple[int, int] | None:
        """(lowest, highest) memory id of ``session``, None when it has none."""
        row = self.read("SELECT (SELECT min(id) FROM memories WHERE session_id = ?1), (SELECT max(id) FROM memories WHERE session_id = ?1)",
                        (session,))[0]
        return None if row[0] is None else (row[0], row[1])

    def get_meta(self, key: str) -> str | None:
        rows = self.read("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def has_vector_table(self) -> bool:
        return bool(self.read("SELECT 1 FROM sqlite_master WHERE name = 'memory_vectors'"))

    def stored_identity(self) -> dict | None:
        raw = self.get_meta("embedder")
        return json.loads(raw) if raw else None

    def bind_embedder(self, identity: dict, *, reindex: str, embed_all) -> int:
        """Make the vectors match ``identity``. Returns how many memories were (re-)embedded.

        ``embed_all(list[str]) -> np.ndarray`` is called only when vectors must be built.
        A mismatch raises unless ``reindex == 'auto'``; re-embedding happens in one transaction,
        so an interruption leaves the old vectors and identity intact.
        """
        stored = self.stored_identity()
        if same_embedder(stored, identity) and self.has_vector_table():
            if stored != identity:  # a database from before sha256/max_tokens were recorded: record them now
                with self.write() as conn:
                    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('embedder', ?)", (json.dumps(identity, sort_keys=True),))
            return 0
        count = self.read("SELECT count(*) FROM memories")[0][0]
        self._refuse_mismatch(stored, identity, count, reindex)
        rows = self.read(_EMBED_ROWS)
        vectors = embed_all([stored_embedding_text(*r[2:]) for r in rows]) if rows else np.zeros((0, identity["dimensions"]), np.float32)
        with self.bulk(), self.write() as conn:
            # Another process may have bound an embedder or saved memories since the reads above
            # (two processes opening a new database at once): decide again under the write lock.
            raw = conn.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
            stored = json.loads(raw[0]) if raw else None
            if same_embedder(stored, identity) and conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_vectors'").fetchone():
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('embedder', ?)", (json.dumps(identity, sort_keys=True),))
                return 0
            latest = conn.execute(_EMBED_ROWS).fetchall()
            self._refuse_mismatch(stored, identity, len(latest), reindex)
            if latest != rows:
                rows, vectors = latest, embed_all([stored_embedding_text(*r[2:]) for r in latest])
            conn.execute("DROP TABLE IF EXISTS memory_vectors")
            codes.clear(conn)
            conn.execute(
                "CREATE VIRTUAL TABLE memory_vectors USING vec0("
                "memory_id INTEGER PRIMARY KEY, session_id TEXT PARTITION KEY, "
                f"embedding FLOAT[{int(identity['dimensions'])}] distance_metric=cosine)"
            )
            insert_vectors(conn, [r[0] for r in rows], [r[1] for r in rows], vectors)
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('embedder', ?)", (json.dumps(identity, sort_keys=True),))
        return len(rows)

    def _refuse_mismatch(self, stored: dict | None, identity: dict, count: int, reindex: str) -> None:
        if stored is not None and not same_embedder(stored, identity) and count and reindex != "auto":
            diff = {k: (stored.get(k), identity.get(k)) for k in identity if stored.get(k) != identity.get(k)}
            raise ModelMismatchError(
                f"Database {self.path} was built with embedder {stored.get('model')} and this config uses "
                f"{identity.get('model')} (differs in: {', '.join(diff)}). Use the original embedding_model, or "
                "re-embed everything with reindex='auto' (CLI: tinycontext reindex).",
                stored=stored, configured=identity,
            )

    # -- export and backup (tinycontext/memory/transfer.py writes the files) ----------------------

    def has_session(self, session: str) -> bool:
        return bool(self.read("SELECT 1 FROM sessions WHERE id = ?", (session,)))

    def dump_sessions(self, session: str | None = None) -> list[tuple[str, str]]:
        """(id, created_at) of every session (or only ``session``), oldest first."""
        where, params = (" WHERE id = ?", [session]) if session is not None else ("", [])
        return self.read(f"SELECT id, created_at FROM sessions{where} ORDER BY created_at, id", params)

    def count_memories(self, session: str | None = None) -> int:
        where, params = (" WHERE session_id = ?", [session]) if session is not None else ("", [])
        return self.read(f"SELECT count(*) FROM memories{where}", params)[0][0]

    def dump_memories(self, session: str | None = None, *, vectors: bool = False, page: int = 256) -> Iterator[dict]:
        """Every memory (or ``session``'s) in id order, as an export keeps it: the fields recall
        returns, plus ``uid``, ``expires_at``, its ``history`` and (``vectors``) the raw ``vector``
        bytes when it has one. Read a page at a time, so huge databases stream."""
        where, params = (" AND session_id = ?", [session]) if session is not None else ("", [])
        last = 0
        while True:
            rows = self.read(f"SELECT {MEMORY_COLUMNS}, uid, expires_at FROM memories WHERE id > ?{where} ORDER BY id LIMIT ?",
                             [last, *params, page])
            if not rows:
                return
            ids = json.dumps([r[0] for r in rows])
            history: dict[int, list[dict]] = {}
            for r in self.read("SELECT memory_id, version, content, tags, metadata, created_at, superseded_at FROM memory_versions "
                               "WHERE memory_id IN (SELECT value FROM json_each(?)) ORDER BY memory_id, version", (ids,)):
                history.setdefault(r[0], []).append({"version": r[1], "content": r[2], "tags": json.loads(r[3]),
                                                     "metadata": json.loads(r[4]), "created_at": r[5], "superseded_at": r[6]})
            blobs = self.vector_blobs([r[0] for r in rows]) if vectors else {}
            for r in rows:
                memory = row_to_memory(r)
                memory.update(uid=r[-2], expires_at=r[-1], history=history.get(r[0], []))
                if r[0] in blobs:
                    memory["vector"] = blobs[r[0]]
                yield memory
            last = rows[-1][0]

    def vector_blobs(self, ids: list[int]) -> dict[int, bytes]:
        """The stored float32 vectors (vec0 blobs) of ``ids`` that have one, by id."""
        if not ids:
            return {}
        with self.reading() as conn:
            try:
                return vector_blobs(conn, ids)
            except self.driver.Error as exc:
                raise storage_error(exc, self.path) from exc

    def superseded_among(self, ids: Iterable[int]) -> set[int]:
        """Which of ``ids`` are facts a newer memory superseded (schema v8, partial index ``memories_superseded``)."""
        listed = [int(i) for i in ids]
        few = SUPERSEDED_WALK * len(listed)
        # SQLite looks every id up in the table (a page read each); while the partial index holds few rows, walking it
        # instead ("+id": not by rowid) costs far less; with none (most stores) the ids are not read at all. The same answer.
        held = self.read("SELECT count(*) FROM (SELECT 1 FROM memories WHERE superseded_by IS NOT NULL LIMIT ?)", (few + 1,))[0][0]
        return {r[0] for r in self.read(f"SELECT id FROM memories WHERE superseded_by IS NOT NULL AND {'+id' if held <= few else 'id'} "
                                        "IN (SELECT value FROM json_each(?))", (json.dumps(listed),))} if held else set()

    def fts_segments(self) -> int:
        """The segments of the full-text indexes (FTS5 writes one per transaction, or more for a big
        one, and merges them only now and then): a BM25 search reads a word's rows from each."""
        return sum(self._segments().values())

    def _segments(self) -> dict[str, int]:
        tables = [r[0] for r in self.read("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE % USING fts5%'")]
        return {table: self.read(f"SELECT count(DISTINCT segid) FROM {table}_idx")[0][0] for table in tables}

    def optimize(self, build_postings: bool | None = None, postings_from: int | None = None) -> dict:
        """Merge each full-text index into one segment (fewer lists to read per word; the same rows and
        scores), and (re)build the BM25 postings snapshot (:mod:`tinycontext.retrieval.postings`), in one
        write transaction: a concurrent reader sees the index before or after, never half of it. Indexes
        already in one segment are left alone (FTS5 would rewrite nothing), and when all are and the
        snapshot is current, nothing is written, so copies keyed on :meth:`stamp` stay valid. Inside this
        thread's write transaction the rows it wrote are not in a segment yet: every index is merged.
        ``build_postings``: None builds the snapshot when one exists and rows changed since, or when there
        is none and the store holds ``postings_from`` memories (None: ``postings.MIN_MEMORIES``); True / False
        always / never."""
        with self.lock:  # the counts and the merge see the same index: no write of this process in between
            before = self._segments()
            merge = [table for table, segments in before.items() if segments > 1 or self.writing]
            rebuild = postings.wanted(self.conn, postings_from) if build_postings is None else build_postings
            if merge or rebuild:
                with self.write() as conn:
                    for table in merge:
                        conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
                    if rebuild:
                        postings.build(conn)  # after the merge: one segment to read
            return {"fts_segments_before": sum(before.values()), "fts_segments": self.fts_segments(),
                    "postings": postings.status(self.conn)}

    def backup_into(self, path: Path) -> tuple[str, int]:
        """Copy the live database into a new file at ``path`` (SQLite's online backup API), left in
        rollback-journal mode as a standalone file; returns its ``integrity_check`` and memory count."""
        try:
            target = self.driver.connect(str(path))
            try:
                with self.lock:
                    self.conn.backup(target)
                target.execute("PRAGMA journal_mode = DELETE")
                return target.execute("PRAGMA integrity_check").fetchone()[0], target.execute("SELECT count(*) FROM memories").fetchone()[0]
            finally:
                target.close()
        except self.driver.Error as exc:
            raise StorageError(str(exc), sqlite_error=getattr(exc, "sqlite_errorname", None) or type(exc).__name__) from exc

    def close(self) -> None:
        with self.lock, self._pool_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
            self.conn.close()


def refusal(path: Path, version: int, tables: set[str], memory_columns: set[str]) -> str | None:
    """Why the SQLite file at ``path`` (its user_version, tables, and columns of ``memories``) is not a
    TinyContext database this version may open, or None when it is one (or empty)."""
    if version > SCHEMA_VERSION:
        return (f"Database {path} has schema v{version}, newer than this TinyContext (v{SCHEMA_VERSION}); "
                "it was not changed. Upgrade tinycontext.")
    if tables and not ({"meta", "sessions", "memories"} <= tables and "content_hash" in memory_columns):
        what = ("a legacy TinyContext database (import it with `tinycontext import PATH`)" if LEGACY_SIGNATURE <= memory_columns
                else "another application's SQLite database")
        return (f"Cannot use database {path}: it is {what}, not a TinyContext database, and was not changed. "
                "Point memory_db_path at a TinyContext database or a new file.")
    return None


def make_folder(path: Path, what: str, fix: str) -> None:
    """Create ``path``'s folder; a parent that is a file, or one that cannot be written, is a StorageError
    saying which (``what``: what the file is for; ``fix``: the start of a sentence naming the setting)."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        blocker = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), folder)
        raise StorageError(f"Cannot create the folder for {what}: {blocker} is a file, not a folder. {fix} a file inside a folder.") from exc
    except OSError as exc:  # permissions, a read-only file system
        raise StorageError(f"Cannot create the folder {folder} for {what}: {exc.strerror or exc}. {fix} a writable place, "
                           "or fix the folder's permissions.") from exc


# SQLite's primary result codes (the low byte of an extended code).
_FULL, _READONLY, _CORRUPT, _NOTADB, _BUSY, _LOCKED, _IOERR, _CANTOPEN = 13, 8, 11, 26, 5, 6, 10, 14


def storage_error(exc: Exception, path) -> StorageError:
    """A SQLite driver error as a StorageError whose message says what to do."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc).lower()
    if primary == _FULL or "database or disk is full" in text:
        advice = "the disk (or the database's page limit) is full: free disk space, then retry"
    elif primary == _READONLY or "readonly" in text or "read-only" in text:
        advice = "the file is read-only: check its permissions and the mount, or point memory_db_path at a writable place"
    elif primary in (_CORRUPT, _NOTADB) or "malformed" in text or "not a database" in text:
        advice = ("the file is damaged or not a TinyContext database: restore a backup (`tinycontext backup` makes them) "
                  "or point memory_db_path at a new file")
    elif primary in (_BUSY, _LOCKED) or "locked" in text or "busy" in text:
        advice = "another process held its lock longer than the timeout: retry"
    elif primary == _IOERR or "i/o error" in text:
        advice = "the disk or file system reported an I/O error: check it, then retry"
    elif primary == _CANTOPEN or "unable to open" in text:
        advice = "the file cannot be opened: check the path and its permissions"
    else:
        advice = "run `tinycontext doctor` to check the database"
    return StorageError(f"Database {path}: {exc} — {advice}. Nothing from this call was saved.",
                        sqlite_error=getattr(exc, "sqlite_errorname", None) or type(exc).__name__)


def typed_storage_errors(cls):
    """Class decorator: SQLite errors escaping a public method of ``cls`` (which has ``store``)
    become StorageError, also those from code that reads the connection directly."""
    for name, method in list(vars(cls).items()):
        if name.startswith("_") or not callable(method):
            continue

        def wrap(method):
            @functools.wraps(method)
            def translated(self, *args, **kwargs):
                try:
                    return method(self, *args, **kwargs)
                except self.store.driver.Error as exc:
                    raise storage_error(exc, self.store.path) from exc
            return translated

        setattr(cls, name, wrap(method))
    return cls

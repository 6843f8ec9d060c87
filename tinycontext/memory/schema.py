"""The schema of a TinyContext database: its migrations, one per version (run by :meth:`Store.migrate`)."""

from __future__ import annotations

import re
import sqlite3

from . import codes
from ..errors import StorageError

SCHEMA_VERSION = 8

# Each migration runs in one transaction together with the user_version bump.
MIGRATIONS: dict[int, str] = {
    1: """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE sessions (id TEXT PRIMARY KEY, created_at TEXT NOT NULL);
        CREATE TABLE memories (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            content TEXT NOT NULL,
            tags TEXT NOT NULL DEFAULT '[]',
            metadata TEXT NOT NULL DEFAULT '{}',
            content_hash TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX memories_session_hash ON memories(session_id, content_hash);
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            content, tags, content='memories', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
            INSERT INTO memories_fts(rowid, content, tags) VALUES (new.id, new.content, new.tags);
        END;
        CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
            INSERT INTO memories_fts(memories_fts, rowid, content, tags) VALUES ('delete', old.id, old.content, old.tags);
        END;
        CREATE TRIGGER memories_au AFTER UPDATE OF content, tags ON memories BEGIN
            INSERT INTO memories_fts(memories_fts, rowid, content, tags) VALUES ('delete', old.id, old.content, old.tags);
            INSERT INTO memories_fts(rowid, content, tags) VALUES (new.id, new.content, new.tags);
        END;
    """,
    # v2: edit history and a tag index for filtered recall.
    2: """
        ALTER TABLE memories ADD COLUMN updated_at TEXT;
        ALTER TABLE memories ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
        CREATE TABLE memory_versions (
            memory_id INTEGER NOT NULL,
            version INTEGER NOT NULL,
            content TEXT NOT NULL,
            tags TEXT NOT NULL,
            metadata TEXT NOT NULL,
            created_at TEXT NOT NULL,
            superseded_at TEXT NOT NULL,
            PRIMARY KEY (memory_id, version)
        );
        CREATE TABLE memory_tags (
            memory_id INTEGER NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
            tag TEXT NOT NULL,
            PRIMARY KEY (tag, memory_id)
        ) WITHOUT ROWID;
        CREATE INDEX memory_tags_memory ON memory_tags(memory_id);
        INSERT OR IGNORE INTO memory_tags(memory_id, tag)
            SELECT memories.id, json_each.value FROM memories, json_each(memories.tags);
    """,
    # v3: conversations. When a memory happened, who said it, what was shared with it, and the
    # episode (chat session) it belongs to; FTS gains a `context` column (speaker, date words,
    # attachments) and episodes get their own FTS index over their whole text.
    3: """
        CREATE TABLE episodes (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            key TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (session_id, key)
        );
        ALTER TABLE memories ADD COLUMN occurred_at TEXT;
        ALTER TABLE memories ADD COLUMN speaker TEXT;
        ALTER TABLE memories ADD COLUMN attachments TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE memories ADD COLUMN context TEXT NOT NULL DEFAULT '';
        ALTER TABLE memories ADD COLUMN episode_id INTEGER REFERENCES episodes(id);
        CREATE VIRTUAL TABLE episodes_fts USING fts5(text, tokenize='porter unicode61 remove_diacritics 2');
        CREATE INDEX memories_episode ON memories(episode_id);
        CREATE INDEX memories_occurred ON memories(session_id, occurred_at);
        DROP TRIGGER memories_ai;
        DROP TRIGGER memories_ad;
        DROP TRIGGER memories_au;
        DROP TABLE memories_fts;
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            content, tags, context, content='memories', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
            INSERT INTO memories_fts(rowid, content, tags, context) VALUES (new.id, new.content, new.tags, new.context);
        END;
        CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
            INSERT INTO memories_fts(memories_fts, rowid, content, tags, context) VALUES ('delete', old.id, old.content, old.tags, old.context);
        END;
        CREATE TRIGGER memories_au AFTER UPDATE OF content, tags, context ON memories BEGIN
            INSERT INTO memories_fts(memories_fts, rowid, content, tags, context) VALUES ('delete', old.id, old.content, old.tags, old.context);
            INSERT INTO memories_fts(rowid, content, tags, context) VALUES (new.id, new.content, new.tags, new.context);
        END;
        INSERT INTO memories_fts(memories_fts) VALUES ('rebuild');
    """,
    # v4: optional expiry (recall and listing delete expired memories first), and an index for
    # created_at range filters.
    4: """
        ALTER TABLE memories ADD COLUMN expires_at TEXT;
        CREATE INDEX memories_expires ON memories(expires_at) WHERE expires_at IS NOT NULL;
        CREATE INDEX memories_created ON memories(created_at);
    """,
    # v5: ids are never reused (AUTOINCREMENT) and every memory has a stable uid (idempotent import).
    5: lambda conn: _never_reuse_ids(conn),
    # v6: a session's first and last id in O(log n), so BM25 can be limited to that id range
    # (see Store.session_span) instead of scoring every session's matches.
    6: "CREATE INDEX IF NOT EXISTS memories_session_id ON memories(session_id, id);",
    # v7: compact codes of every vector for the two-stage dense search (tinycontext/memory/codes.py), built
    # here for the vectors already stored; deleting a memory deletes its codes.
    7: lambda conn: _add_codes(conn),
    # v8: facts that supersede facts. valid_from: since when the fact holds (NULL: since it was saved);
    # valid_until and superseded_by: set on the old memory when a newer one supersedes it (recall then
    # prefers the newer). The old memory and its history stay.
    8: lambda conn: _add_validity(conn),
}


def _add_validity(conn) -> None:
    # Each column only when missing: re-running the step on a database that has them changes nothing.
    have = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
    for column in ("valid_from TEXT", "valid_until TEXT", "superseded_by INTEGER"):
        if column.split()[0] not in have:
            conn.execute(f"ALTER TABLE memories ADD COLUMN {column}")
    conn.execute("CREATE INDEX IF NOT EXISTS memories_superseded ON memories(superseded_by) WHERE superseded_by IS NOT NULL")


def _add_codes(conn) -> None:
    conn.execute("CREATE TABLE memory_bits (session_id TEXT NOT NULL, memory_id INTEGER NOT NULL, bits BLOB NOT NULL, "
                 "PRIMARY KEY (session_id, memory_id)) WITHOUT ROWID")
    conn.execute("CREATE TABLE memory_codes (memory_id INTEGER PRIMARY KEY, codes BLOB NOT NULL)")
    conn.execute("CREATE TRIGGER memories_codes_ad AFTER DELETE ON memories BEGIN "
                 "DELETE FROM memory_bits WHERE session_id = old.session_id AND memory_id = old.id; "
                 "DELETE FROM memory_codes WHERE memory_id = old.id; END")
    codes.backfill(conn)


def _never_reuse_ids(conn) -> None:
    """SQLite cannot add AUTOINCREMENT to a table, so ``memories`` is rebuilt from its own definition
    (whatever columns earlier migrations added), keeping every row and id; its indexes and triggers
    are recreated. The FTS index is keyed by id and the text does not change, so it stays valid.
    Runs with foreign keys off (see migrate): dropping the table must not cascade to memory_tags."""
    table_sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'memories'").fetchone()[0]
    if "AUTOINCREMENT" not in table_sql.upper():
        new_sql, found = re.subn(r"\bid\s+INTEGER\s+PRIMARY\s+KEY\b", "id INTEGER PRIMARY KEY AUTOINCREMENT", table_sql, count=1, flags=re.I)
        if found != 1:
            raise StorageError("Cannot find the memories table's id column to upgrade; the database schema was changed by hand.")
        extras = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE tbl_name = 'memories' AND type IN ('index', 'trigger') "
                                             "AND sql IS NOT NULL ORDER BY type, name")]
        conn.execute("CREATE TEMP TABLE memories_copy AS SELECT * FROM memories")
        conn.execute("DROP TABLE memories")
        conn.execute(new_sql)
        conn.execute("INSERT INTO memories SELECT * FROM temp.memories_copy")  # explicit ids also set sqlite_sequence
        conn.execute("DROP TABLE temp.memories_copy")
        for sql in extras:
            conn.execute(sql)
    if "uid" not in {r[1] for r in conn.execute("PRAGMA table_info(memories)")}:
        conn.execute("ALTER TABLE memories ADD COLUMN uid TEXT")
    conn.execute("UPDATE memories SET uid = lower(hex(randomblob(16))) WHERE uid IS NULL")
    conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS memories_uid ON memories(uid)")


def split_sql(script: str) -> list[str]:
    """Split a migration into statements; complete_statement knows a trigger's BEGIN...END."""
    statements, buffer = [], ""
    for line in script.strip().splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    return statements

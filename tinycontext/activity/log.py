"""The activity log's file, what one record holds, and the queries the management views ask."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from ..config import TinyContextConfig
from ..errors import StorageError

# The operations each per-caller view shows.
SEARCHES = ("search",)
PAGES = ("scrape_urls", "browser_navigate", "browser_act")
MEMORY = ("save_memories", "recall_memories", "get_memory", "update_memory", "delete_memory", "list_memories",
          "list_sessions", "delete_memories")
# Outcome words are codes (ok, blocked, memory_not_found...): anything else is not kept, so no text slips in.
CODE = re.compile(r"[a-z][a-z0-9_]{0,39}")
# A rendered answer is bounded by its token budget already; this bounds a record whatever the budget.
MAX_SHOWN_CHARS = 200_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    caller TEXT,
    transport TEXT NOT NULL,
    operation TEXT NOT NULL,
    outcome TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    counts TEXT NOT NULL,
    request TEXT,
    shown TEXT,
    domains TEXT
);
CREATE INDEX IF NOT EXISTS events_at ON events(at);
CREATE INDEX IF NOT EXISTS events_caller ON events(caller, id);
"""


@dataclass(frozen=True)
class Event:
    """One tool call as an adapter saw it: ``answer`` is its structured result (only its numbers and outcome
    codes are kept, see :func:`counts_of`), ``shown`` the text the model read. ``caller`` is the raw
    identity (None: unidentified); only its salted hash is written. ``request``, ``shown`` and the
    answer's domains are kept in content mode only."""

    operation: str
    outcome: str
    duration_ms: int
    transport: str
    caller: str | None = None
    request: Any = None
    answer: Any = None
    shown: str | None = None


def counts_of(structured: Any) -> dict:
    """The numbers of an answer and nothing else: its top-level numbers and flags, the length of each
    top-level list, the summed lengths of the lists inside their items, and the items' outcome codes."""
    out: dict[str, Any] = {}
    if not isinstance(structured, dict):
        return out
    outcomes: dict[str, int] = {}
    for key, value in structured.items():
        if not CODE.fullmatch(str(key)):
            continue
        if isinstance(value, (bool, int, float)):
            out[key] = value
        elif isinstance(value, list):
            out[key] = len(value)
            for item in value:
                if not isinstance(item, dict):
                    continue
                outcome = item.get("outcome")
                if isinstance(outcome, str) and CODE.fullmatch(outcome):
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                for inner, nested in item.items():
                    if isinstance(nested, list) and CODE.fullmatch(str(inner)):
                        out[f"{key}.{inner}"] = out.get(f"{key}.{inner}", 0) + len(nested)
    if outcomes:
        out["outcomes"] = outcomes
    return out


def _host(url: Any) -> str | None:
    try:
        return (urlsplit(url).hostname or None) if isinstance(url, str) else None
    except ValueError:
        return None


def domains_of(operation: str, structured: Any) -> dict:
    """{discovered: hosts a search returned, fetched: hosts a scrape or the browser read} (content mode)."""
    discovered: list[str] = []
    fetched: list[str] = []
    if isinstance(structured, dict):
        if operation == "search":
            discovered = [_host(r.get("url")) for s in structured.get("searches") or [] if isinstance(s, dict)
                          for r in s.get("results") or [] if isinstance(r, dict)]
        elif operation == "scrape_urls":
            fetched = [_host(r.get("url")) for r in structured.get("results") or [] if isinstance(r, dict)]
        elif operation in ("browser_navigate", "browser_act"):
            fetched = [_host(structured.get("url"))]
    return {"discovered": sorted({d for d in discovered if d}), "fetched": sorted({d for d in fetched if d})}


def _owner_only(path: Path) -> None:
    """Create the folders that are missing as 0700 and the file as 0600, whatever the umask; an existing
    file is set back to 0600 (its WAL and shared-memory files take its mode from SQLite)."""
    missing = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for side in ("-wal", "-shm"):
        if Path(f"{path}{side}").exists():
            os.chmod(f"{path}{side}", 0o600)


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds")


class ActivityLog:
    """The activity file of one configuration; safe to share between threads."""

    def __init__(self, path: Path, *, mode: str, retention_days: int, max_events: int, clock=time.time):
        if mode not in ("history", "content"):
            raise ValueError(f"activity mode {mode!r} keeps no records")
        self.path, self.mode, self.clock = Path(path), mode, clock
        self.retention_s, self.max_events = retention_days * 86_400, max_events
        self._lock = threading.Lock()
        try:
            _owner_only(self.path)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            # secure_delete: a pruned or cleared record's bytes are overwritten, not left in free pages.
            self._db.executescript("PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                                   "PRAGMA secure_delete=ON;" + SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('salt', ?)", (secrets.token_bytes(32),))
            self._salt = bytes(self._db.execute("SELECT value FROM meta WHERE key = 'salt'").fetchone()[0])
            if mode == "history":  # content kept under an earlier content mode goes now
                self._db.execute("UPDATE events SET request = NULL, shown = NULL, domains = NULL "
                                 "WHERE request IS NOT NULL OR shown IS NOT NULL OR domains IS NOT NULL")
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"Cannot open the activity records {self.path}: {exc}. Fix the path "
                               "(activity_db) or its permissions, or set activity=off.") from exc

    def caller_hash(self, identity: str | None) -> str | None:
        """The stored form of a caller: HMAC-SHA256 of the identity under this file's salt."""
        if identity is None:
            return None
        return hmac.new(self._salt, identity.encode("utf-8"), hashlib.sha256).hexdigest()

    def record(self, event: Event) -> None:
        """Write ``event`` (content only in content mode), then drop what retention no longer keeps."""
        content = self.mode == "content"
        domains = domains_of(event.operation, event.answer) if content else None
        outcome = event.outcome if CODE.fullmatch(event.outcome or "") else "error"
        row = (self.clock(), self.caller_hash(event.caller), event.transport, event.operation, outcome,
               max(0, int(event.duration_ms)), json.dumps(counts_of(event.answer)),
               json.dumps(event.request, ensure_ascii=False, default=str) if content and event.request is not None else None,
               event.shown[:MAX_SHOWN_CHARS] if content and event.shown is not None else None,
               json.dumps(domains) if domains and (domains["discovered"] or domains["fetched"]) else None)
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.execute("INSERT INTO events(at, caller, transport, operation, outcome, duration_ms, counts, "
                                     "request, shown, domains) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
                    self._prune()
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise StorageError(f"Cannot write the activity records {self.path}: {exc}.") from exc

    def _prune(self) -> None:
        self._db.execute("DELETE FROM events WHERE at < ?", (self.clock() - self.retention_s,))
        # Ids only grow, so the newest max_events lie above max(id) - max_events (fewer where some were
        # cleared); found through the rowid, not by stepping over max_events rows on every write.
        self._db.execute("DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?", (self.max_events,))

    def _rows(self, sql: str, args: Iterable = ()) -> list[sqlite3.Row]:
        with self._lock:
            cursor = self._db.execute(sql, tuple(args))
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def events(self, caller_hash: str | None, operations: Iterable[str], limit: int = 50) -> list[dict]:
        """The newest records of one caller for these operations, as the per-caller views show them."""
        ops = tuple(operations)
        rows = self._rows(f"SELECT * FROM events WHERE caller IS ? AND operation IN ({', '.join('?' * len(ops))}) "
                          "ORDER BY id DESC LIMIT ?", (caller_hash, *ops, limit))
        out = []
        for row in rows:
            item = {"at": _iso(row["at"]), "operation": row["operation"], "outcome": row["outcome"],
                    "duration_ms": row["duration_ms"], "counts": json.loads(row["counts"]), "transport": row["transport"]}
            for key in ("request", "domains"):
                if row[key] is not None:
                    item[key] = json.loads(row[key])
            if row["shown"] is not None:
                item["shown"] = row["shown"]
            out.append(item)
        return out

    def clear(self, caller_hash: str) -> int:
        """Delete every record of one caller; the number deleted."""
        with self._lock:
            deleted = self._db.execute("DELETE FROM events WHERE caller = ?", (caller_hash,)).rowcount
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the deleted pages leave the WAL too
        return deleted

    def summary(self) -> dict:
        """Counts for the instance health view: records by operation and outcome, callers, time span."""
        by: dict[str, dict[str, int]] = {}
        for row in self._rows("SELECT operation, outcome, COUNT(*) AS n FROM events GROUP BY operation, outcome"):
            by.setdefault(row["operation"], {})[row["outcome"]] = row["n"]
        span = self._rows("SELECT COUNT(*) AS n, MIN(at) AS first, MAX(at) AS last, COUNT(DISTINCT caller) AS callers, "
                          "SUM(caller IS NULL) AS unidentified FROM events")[0]
        return {"mode": self.mode, "retention_days": self.retention_s // 86_400, "max_events": self.max_events,
                "events": span["n"], "first": _iso(span["first"]) if span["first"] else None,
                "last": _iso(span["last"]) if span["last"] else None, "callers": span["callers"],
                "unidentified_events": span["unidentified"] or 0, "blocked_items": self.blocked_items(), "by_operation": by}

    def blocked_items(self) -> int:
        """How many fetched items the web guard blocked, over every record kept."""
        return self._rows("SELECT COALESCE(SUM(json_extract(counts, '$.outcomes.blocked')), 0) AS n FROM events")[0]["n"]

    def domains(self) -> list[dict]:
        """Each domain with how many calls found it in search results and how many read it (content mode)."""
        seen: dict[str, dict[str, int]] = {}
        for row in self._rows("SELECT domains FROM events WHERE domains IS NOT NULL"):
            found = json.loads(row["domains"])
            for kind in ("discovered", "fetched"):
                for domain in found.get(kind, []):
                    seen.setdefault(domain, {"discovered": 0, "fetched": 0})[kind] += 1
        return [{"domain": d, **n} for d, n in sorted(seen.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))]

    def close(self) -> None:
        with self._lock:
            self._db.close()


_logs: dict[tuple, ActivityLog] = {}
_logs_lock = threading.Lock()


def open_activity(config: TinyContextConfig) -> ActivityLog | None:
    """The shared activity log for ``config`` (one per file and policy), or None when activity is off."""
    if config.activity == "off":
        return None
    key = (str(config.activity_db), config.activity, config.activity_retention_days, config.activity_max_events)
    with _logs_lock:
        if key not in _logs:
            _logs[key] = ActivityLog(config.activity_db, mode=config.activity, retention_days=config.activity_retention_days,
                                     max_events=config.activity_max_events)
        return _logs[key]


def close_activity() -> None:
    """Close every shared activity log (tests, server shutdown)."""
    with _logs_lock:
        while _logs:
            _logs.popitem()[1].close()

"""One results store that every run appends to, so runs across commits can be queried together.

A SQLite file on the machine's local disk (``results_store``, default ``<cache_dir>/results.sqlite``):
SQLite's locking does not work on network filesystems, so never point it at NFS. Jobs on other hosts
keep their own store; ``tinycontext-eval ingest <sweep dir>`` appends a sweep's ``result.json`` files
(plain files, safe on any filesystem) to the local store, idempotently.

A finished job is found again by its ``job_key`` (config + dataset + model + code fingerprint):
sweeps skip it unless ``--force``/``force=true``.
"""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pandas as pd

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    job_key TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    git_commit TEXT,
    git_dirty INTEGER,
    dataset TEXT,
    embedder TEXT,
    row_json TEXT NOT NULL,
    record_json TEXT NOT NULL,
    per_query_csv TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_job_key ON runs(job_key, finished_at);
"""


class ResultsStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.executescript(SCHEMA)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def append(self, record: dict, per_query: pd.DataFrame) -> bool:
        """Add one finished run; False when this run id is already stored (re-ingesting changes nothing)."""
        manifest = record.get("manifest", {})
        git = manifest.get("git", {})
        row = record["row"]
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO runs(run_id, job_key, finished_at, git_commit, git_dirty, dataset, embedder, row_json,"
            " record_json, per_query_csv) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (record["run_id"], record["job_key"], record["finished_at"], git.get("commit"),
             None if git.get("dirty") is None else int(git["dirty"]), row.get("dataset"), row.get("embedder"),
             json.dumps(row, default=str), json.dumps(record, default=str), per_query.to_csv(index=False)),
        )
        return cursor.rowcount == 1

    def find(self, job_key: str) -> tuple[dict, pd.DataFrame] | None:
        """The newest finished run with this job key: (record, per-query frame)."""
        hit = self._conn.execute(
            "SELECT record_json, per_query_csv FROM runs WHERE job_key = ? ORDER BY finished_at DESC LIMIT 1", (job_key,)
        ).fetchone()
        if hit is None:
            return None
        return json.loads(hit[0]), pd.read_csv(io.StringIO(hit[1]), dtype={"query_id": str})

    def get(self, run_id: str) -> tuple[dict, pd.DataFrame] | None:
        hit = self._conn.execute("SELECT record_json, per_query_csv FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if hit is None:
            return None
        return json.loads(hit[0]), pd.read_csv(io.StringIO(hit[1]), dtype={"query_id": str})

    def runs(self) -> pd.DataFrame:
        """Every stored run, one row each: the result row's columns plus run id, commit and time."""
        rows = self._conn.execute(
            "SELECT run_id, job_key, finished_at, git_commit, git_dirty, row_json FROM runs ORDER BY finished_at").fetchall()
        return pd.DataFrame([{"run_id": r[0], "job_key": r[1], "finished_at": r[2], "git_commit": r[3], "git_dirty": r[4],
                              **json.loads(r[5])} for r in rows])

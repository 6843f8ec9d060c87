"""One results store that every run appends to, so runs across commits can be queried together.

A SQLite file on the machine's local disk (``results_store``, default ``<cache_dir>/results.sqlite``):
SQLite's locking does not work on network filesystems, so never point it at NFS. Jobs on other hosts
keep their own store; ``tinycontext-eval ingest <sweep dir>`` appends a sweep's job directories
(plain files, safe on any filesystem) to the local store, idempotently.

A finished job is found again by its ``job_key`` (config + dataset + model + code + host + package
versions): sweeps skip it unless ``force=true``. Every stored run is checked against its content hash
when it is read (``evals.records.verify``); an edited one is refused with an error naming it.

Schema (documented for SQL; evals/README.md, "Querying the results store"):

- ``runs``: one row per finished run. ``run_id``, ``job_key``, ``finished_at`` (ISO 8601 UTC),
  ``git_commit``, ``git_dirty``, ``dataset``, ``embedder``, ``content_sha256``, ``row_json`` (the
  summary row: ``json_extract(row_json, '$."ndcg@10"')``), ``record_json`` (the whole record),
  ``per_query_csv``, ``files_json`` ({file name: text}: the TREC run and qrels files).
- ``per_query``: one row per (run, query): ``run_id``, ``query_id``, ``split`` (tune/test/both),
  ``metric``, ``value``; every numeric per-query column (nDCG@10, R@k, MRR@10, budget recall,
  tokens, latency).
- ``rankings``: one row per (run, query, rank): ``run_id``, ``split``, ``query_id``, ``doc_id``,
  ``rank``, ``score`` (the TREC run files, full depth).
"""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pandas as pd

from .records import read_run, verify

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
CREATE TABLE IF NOT EXISTS per_query (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    query_id TEXT NOT NULL,
    split TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run_id, query_id, metric)
);
CREATE TABLE IF NOT EXISTS rankings (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    split TEXT NOT NULL,
    query_id TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    score REAL NOT NULL,
    PRIMARY KEY (run_id, split, query_id, rank)
);
"""
# Columns added after the first stores were written (added in place to an older store).
ADDED = {"content_sha256": "TEXT", "files_json": "TEXT"}
NOT_METRICS = {"query_id", "tune", "test", "session", "category"}


class ResultsStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.executescript(SCHEMA)
        have = {r[1] for r in self._conn.execute("PRAGMA table_info(runs)")}
        for name, kind in ADDED.items():
            if name not in have:
                self._conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def append(self, record: dict, files: dict[str, bytes]) -> bool:
        """Add one finished run (its record and files: per_query.csv, run and qrels files); False when
        this run id is already stored (re-ingesting changes nothing)."""
        manifest = record.get("manifest", {})
        git = manifest.get("git", {})
        row = record["row"]
        texts = {name: data.decode("utf-8") for name, data in files.items()}
        per_query = texts.pop("per_query.csv")
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            cursor = self._conn.execute(
                "INSERT OR IGNORE INTO runs(run_id, job_key, finished_at, git_commit, git_dirty, dataset, embedder, row_json,"
                " record_json, per_query_csv, content_sha256, files_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record["run_id"], record["job_key"], record["finished_at"], git.get("commit"),
                 None if git.get("dirty") is None else int(git["dirty"]), row.get("dataset"), row.get("embedder"),
                 json.dumps(row, default=str), json.dumps(record, default=str), per_query,
                 record.get("content_sha256"), json.dumps(texts)),
            )
            if cursor.rowcount != 1:
                return False
            self._conn.executemany("INSERT OR IGNORE INTO per_query VALUES (?, ?, ?, ?, ?)",
                                   _per_query_rows(record["run_id"], pd.read_csv(io.StringIO(per_query), dtype={"query_id": str})))
            self._conn.executemany("INSERT OR IGNORE INTO rankings VALUES (?, ?, ?, ?, ?, ?)",
                                   [(record["run_id"], name.split(".")[1], q, d, rank, score)
                                    for name, text in texts.items() if name.startswith("run.")
                                    for q, docs in read_run(text).items()
                                    for rank, (d, score) in enumerate(sorted(docs.items(), key=lambda x: -x[1]), start=1)])
        return True

    def _load(self, hit, where: str) -> tuple[dict, pd.DataFrame, dict[str, bytes]] | None:
        record_json, per_query_csv, files_json = hit
        record = json.loads(record_json)
        files = {"per_query.csv": per_query_csv.encode()}
        files.update({n: t.encode() for n, t in json.loads(files_json or "{}").items()})
        verify(record, files, where)
        return record, pd.read_csv(io.StringIO(per_query_csv), dtype={"query_id": str}), files

    def find(self, job_key: str) -> tuple[dict, pd.DataFrame, dict[str, bytes]] | None:
        """The newest finished run with this job key that carries a content hash: (record, per-query
        frame, files). Runs from before content hashes are not reused; a run that fails its hash is
        refused (TamperedError)."""
        hit = self._conn.execute(
            "SELECT record_json, per_query_csv, files_json, run_id FROM runs WHERE job_key = ? AND content_sha256 IS NOT NULL"
            " ORDER BY finished_at DESC LIMIT 1", (job_key,)).fetchone()
        return None if hit is None else self._load(hit[:3], f"results store {self.path}, run {hit[3]}")

    def get(self, run_id: str) -> tuple[dict, pd.DataFrame, dict[str, bytes]] | None:
        hit = self._conn.execute("SELECT record_json, per_query_csv, files_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if hit is None else self._load(hit, f"results store {self.path}, run {run_id}")

    def runs(self) -> pd.DataFrame:
        """Every stored run, one row each: the result row's columns plus run id, commit and time."""
        rows = self._conn.execute(
            "SELECT run_id, job_key, finished_at, git_commit, git_dirty, row_json FROM runs ORDER BY finished_at").fetchall()
        return pd.DataFrame([{"run_id": r[0], "job_key": r[1], "finished_at": r[2], "git_commit": r[3], "git_dirty": r[4],
                              **json.loads(r[5])} for r in rows])


def _per_query_rows(run_id: str, per_query: pd.DataFrame):
    split = ["both" if tu and te else "tune" if tu else "test" for tu, te in zip(per_query["tune"], per_query["test"])]
    for column in per_query.columns:
        if column in NOT_METRICS or not pd.api.types.is_numeric_dtype(per_query[column]) or per_query[column].dtype == bool:
            continue
        for qid, s, value in zip(per_query["query_id"], split, per_query[column]):
            yield run_id, str(qid), s, column, None if pd.isna(value) else float(value)

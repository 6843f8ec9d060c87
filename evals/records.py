"""What a finished job keeps, and how a report reads it back without replaying a figure unchecked.

A job directory holds ``result.json`` (the record), ``per_query.csv``, one TREC run file per split
(``run.<split>.trec``: every query's full ranking, as deep as the run retrieved) and the TREC qrels
of that split (``qrels.<split>.trec``). The record carries the sha256 of each file and a content hash
over itself and them (:func:`seal`); a record or file edited afterwards fails :func:`verify` with an
error naming it. The report never trusts a stored summary: every quality figure is scored again
from the run files and qrels with ir_measures, and every summary (means, CIs, tokens, latency
percentiles) is recomputed from the per-query values (:func:`derive`); a stored figure that differs
from its derivation is refused too.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from pathlib import Path

import ir_measures
import numpy as np
import pandas as pd

from tinycontext import ConfigError

from .metrics import latency_summary, per_query_quality, recall_within, token_summary
from .stats import summary

QUALITY_MEASURES = ["ndcg@10", "recall@5", "recall@10", "recall@100", "mrr@10"]
QUALITY = [*QUALITY_MEASURES, "budget_recall"]
CATEGORY_METRICS = ["recall@5", "recall@10", "ndcg@10", "budget_recall"]
UNHASHED = ("content_sha256", "reused_run")  # added when a stored job is reused: not measured content
UNHASHED_ROW = ("overrides", "job")          # how the job was named in this sweep
TOLERANCE = 1e-9
RUN_TAG = "tinycontext"


class TamperedError(ConfigError):
    """A stored record, or a file beside it, is not what the harness wrote."""


def run_file(split: str) -> str:
    return f"run.{split}.trec"


def qrels_file(split: str) -> str:
    return f"qrels.{split}.trec"


def trec_run(rankings: dict[str, list[tuple[str, float]]], qids, tag: str = RUN_TAG) -> str:
    """TREC run lines ``qid Q0 docid rank score tag`` for ``qids`` (a query that retrieved nothing has no line)."""
    out = io.StringIO()
    for qid in qids:
        for rank, (doc, score) in enumerate(rankings.get(qid, []), start=1):
            out.write(f"{qid} Q0 {doc} {rank} {score:.6g} {tag}\n")
    return out.getvalue()


def trec_qrels(qrels: dict[str, dict[str, int]], qids) -> str:
    """TREC qrels lines ``qid 0 docid relevance`` for ``qids``."""
    return "".join(f"{q} 0 {d} {g}\n" for q in qids for d, g in qrels[q].items())


def read_run(text: str) -> dict[str, dict[str, float]]:
    """Any TREC run (ours or another system's): {qid: {docid: score}}."""
    run: dict[str, dict[str, float]] = {}
    for line in ir_measures.read_trec_run(io.StringIO(text)):
        run.setdefault(line.query_id, {})[line.doc_id] = float(line.score)
    return run


def read_qrels(text: str) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for line in ir_measures.read_trec_qrels(io.StringIO(text)):
        qrels.setdefault(line.query_id, {})[line.doc_id] = int(line.relevance)
    return qrels


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(record: dict) -> bytes:
    body = {k: v for k, v in record.items() if k not in UNHASHED}
    body["row"] = {k: v for k, v in record["row"].items() if k not in UNHASHED_ROW}
    return json.dumps(body, sort_keys=True, default=str).encode()


def seal(record: dict, files: dict[str, bytes]) -> dict:
    """Record the sha256 of each file and a content hash over the record and the files."""
    record["files"] = {name: _sha(data) for name, data in sorted(files.items())}
    record.pop("content_sha256", None)
    record["content_sha256"] = _sha(_canonical(record))
    return record


def verify(record: dict, files: dict[str, bytes], where: str) -> None:
    """Refuse a record whose content hash or files do not match what was written (``where`` names it)."""
    stored = record.get("content_sha256")
    if not stored:
        raise TamperedError(f"{where} has no content hash: it was written by an older harness or by hand. "
                            "Run the job again (force=true) to measure it afresh.", where=where)
    if _sha(_canonical(record)) != stored:
        raise TamperedError(f"{where}: the record does not match its content hash; it was edited after the run "
                            "wrote it. Delete it and run the job again (force=true).", where=where)
    expected = record.get("files", {})
    for name, sha in expected.items():
        if name not in files:
            raise TamperedError(f"{where}: {name} is missing.", where=where)
        if _sha(files[name]) != sha:
            raise TamperedError(f"{where}: {name} does not match the sha256 its record holds; it was edited after "
                                "the run wrote it. Delete the job and run it again (force=true).", where=where)


def score(per_query: pd.DataFrame, runs: dict[str, str], qrels: dict[str, str]) -> pd.DataFrame:
    """per_query with every quality column scored from the TREC run files and qrels (ir_measures) and
    budget recall from the documents each query received."""
    out = per_query.copy()
    judged: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for split in runs:
        judged.update(read_qrels(qrels[split]))
        run.update(read_run(runs[split]))
    quality = per_query_quality(judged, run)
    for name in QUALITY_MEASURES:
        out[name] = [quality.get(q, {}).get(name, 0.0) for q in out["query_id"]]
    received = out["received"].fillna("").astype(str)
    out["budget_recall"] = [recall_within([d for d in r.split(";") if d], judged.get(q, {}))
                            for q, r in zip(out["query_id"], received)]
    return out


def summarise(per_query: pd.DataFrame, latency: dict, schema_tokens: float = 0) -> dict:
    """Every summary figure of a job's row, from its per-query values and its timing passes
    (``schema_tokens``: the MCP tool definitions every request carries, a fact of the config)."""
    tune, test = per_query[per_query["tune"].astype(bool)], per_query[per_query["test"].astype(bool)]
    row: dict = {}
    for prefix, part in (("", test), ("tune_", tune)):
        for name in QUALITY:
            row.update({f"{prefix}{k}": v for k, v in summary(part[name].to_numpy(), name).items()})
    row.update(token_summary(test["tokens_returned"].tolist(), test["tokens_naive"].tolist(), schema_tokens))
    row.update(latency_figures(latency))
    if "category" in test:
        for category, part in test.groupby("category"):
            row[f"cat{category}_queries"] = len(part)
            for name in CATEGORY_METRICS:
                row.update({f"cat{category}_{k}": v for k, v in summary(part[name].to_numpy(), name).items()})
    row["queries_tune"], row["queries_test"] = len(tune), len(test)
    return row


def latency_figures(latency: dict) -> dict:
    """p50/p95/p99 over the timing passes taken without external load (all passes, flagged, when none
    was), with bootstrap CIs on p50 and p95."""
    from .stats import percentile_ci

    passes = latency.get("passes", [])
    clean = [p for p in passes if not p["loaded"]]
    used = clean or passes
    ms = [x for p in used for x in p["ms"]]
    out = latency_summary(ms)
    for q in (50, 95):
        low, high = percentile_ci(ms, q)
        out[f"recall_p{q}_ms_ci_low"], out[f"recall_p{q}_ms_ci_high"] = low, high
    out["latency_passes"], out["latency_passes_loaded"] = len(passes), len(passes) - len(clean)
    # No pass ran without external load: these figures must not decide a latency limit.
    out["latency_flagged"] = bool(passes) and not clean
    out["latency_queries"] = len(used[0]["ms"]) if used else 0
    return out


def _same(a, b) -> bool:
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)) and not isinstance(a, bool):
        fa, fb = float(a), float(b)
        return (math.isnan(fa) and math.isnan(fb)) or abs(fa - fb) <= TOLERANCE * max(1.0, abs(fa), abs(fb))
    return a == b


def derive(record: dict, per_query: pd.DataFrame, runs: dict[str, str], qrels: dict[str, str], where: str) -> tuple[dict, pd.DataFrame]:
    """(the row, per_query) as the stored rankings and qrels say they are; a stored per-query score or
    summary figure that differs from its derivation is refused (a TamperedError naming ``where``)."""
    scored = score(per_query, runs, qrels)
    for name in QUALITY:
        if name in per_query:
            stored = per_query[name].to_numpy(float)
            bad = np.flatnonzero(~np.isclose(stored, scored[name].to_numpy(float), rtol=0, atol=1e-9))
            if bad.size:
                q = per_query["query_id"].iloc[bad[0]]
                raise TamperedError(f"{where}: per-query {name} of query {q} is {stored[bad[0]]:.6g}, but its run file "
                                    f"and qrels give {scored[name].iloc[bad[0]]:.6g}.", where=where)
    derived = summarise(scored, record.get("latency", {}), record["row"].get("schema_tokens", 0))
    row = dict(record["row"])
    for key, value in derived.items():
        if key in row and not _same(row[key], value):
            raise TamperedError(f"{where}: stored {key} {row[key]} differs from {value} derived from its per-query "
                                "rankings and qrels.", where=where)
        row[key] = value
    return row, scored


def job_files(folder: Path) -> dict[str, bytes]:
    """The files of a job directory the record hashes (per_query.csv, run and qrels files)."""
    names = ["per_query.csv", *sorted(p.name for p in folder.glob("*.trec"))]
    return {n: (folder / n).read_bytes() for n in names if (folder / n).is_file()}


def splits_of(record: dict) -> list[str]:
    return [s for s in dict.fromkeys([record["row"]["tune_split"], record["row"]["test_split"]])]

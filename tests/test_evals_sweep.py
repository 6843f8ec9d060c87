"""End to end: a real Hydra multirun of the harness on the shipped tiny dataset with the real
built-in model, then the report and recommend commands on its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from evals.run import _commands
from tinycontext import load_config

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ["dataset", "embedder", "pooling", "query_prefix", "document_prefix", "dense_weight", "rrf_k", "ndcg@10",
            "recall@10", "recall@100", "mrr@10", "index_docs_per_s", "recall_p50_ms", "recall_p95_ms", "tokens_returned",
            "tokens_naive", "token_savings", "budget_recall", "peak_rss_mb", "index_seconds"]


def cli(*args, env=None):
    result = subprocess.run([sys.executable, "-m", "evals.run", *args], check=False, cwd=REPO, capture_output=True, text=True,
                            timeout=300, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        pytest.fail(f"evals.run {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    out = root / "sweep"
    result = cli("-m", "dataset=tiny", "embedder=fast,minilm-static256", "retrieval.dense_weight=0,0.5,1",
                 "retrieval.rrf_k=10,60", "budget.max_tokens=120", f"hydra.sweep.dir={out}",
                 env={"TINYCONTEXT_EVAL_CACHE": str(root / "cache"), "TINYCONTEXT_SHARED": str(REPO.parent / "shared")})
    return out, root / "cache", result.stdout + result.stderr


def test_sweep_writes_one_row_per_config(sweep):
    out, _, log = sweep
    rows = pd.read_csv(out / "results.csv")
    assert len(rows) == 12 and not set(REQUIRED) - set(rows.columns)
    assert set(rows["embedder"]) == {"fast", "minilm-static256"}
    assert rows[["ndcg@10", "recall@10", "recall@100", "mrr@10", "budget_recall"]].apply(lambda c: c.between(0, 1).all()).all()
    assert (rows["tokens_returned"] <= 120).all() and (rows["tokens_naive"] >= rows["tokens_returned"]).all()
    # BM25 alone may match only a few tiny documents (all of them fit); with dense candidates the
    # naive top-100 dump is larger than what the budget lets through, unless the relevance floor
    # (recall_min_dense) left only what fits; over the sweep it is larger somewhere.
    hybrid = rows[rows["dense_weight"] > 0]
    assert (hybrid["tokens_naive"] >= hybrid["tokens_returned"]).all() and (hybrid["tokens_naive"] > hybrid["tokens_returned"]).any()
    assert "12/12 configs done" in log and "ETA" in log


def test_dense_weight_extremes_are_the_single_retrievers(sweep):
    rows = pd.read_csv(sweep[0] / "results.csv")
    metrics = ["ndcg@10", "recall@10", "recall@100", "mrr@10", "budget_recall", "tokens_returned"]
    bm25 = rows[rows["dense_weight"] == 0]
    # BM25 alone: neither the fusion constant nor the embedder can change anything.
    assert (bm25[metrics].nunique() == 1).all()
    for _, dense in rows[rows["dense_weight"] == 1].groupby("embedder"):
        assert (dense[metrics].nunique() == 1).all()  # dense alone: rrf_k changes nothing
    report = (sweep[0] / "report.md").read_text()
    assert "BM25 alone (nDCG@10 independent of rrf_k and embedder): yes" in report
    assert "dense alone (nDCG@10 independent of rrf_k): yes" in report


def test_each_embedder_indexes_once(sweep):
    out, cache, _ = sweep
    assert len(list((cache / "indexes").glob("*.db"))) == 2
    records = [json.loads(p.read_text()) for p in out.glob("*/result.json")]
    built = [r for r in records if not r["row"]["index_reused"]]
    assert sorted(r["row"]["embedder"] for r in built) == ["fast", "minilm-static256"]
    assert all(r["row"]["index_embedded"] == 30 for r in built)
    env = records[0]["environment"]
    assert env["packages"]["tinycontext"] and env["cpu_count"] and records[0]["model"]["sha256"]
    assert len(records[0]["dataset"]["fingerprint"]) == 64


def test_report_plots_and_per_query(sweep):
    out = sweep[0]
    report = (out / "report.md").read_text()
    assert "## What was swept" in report and "`dense_weight`: 0.0, 0.5, 1.0" in report and "## tiny" in report
    for name in ("quality_vs_dense_weight", "quality_vs_latency", "tokens_vs_recall"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    per_query = pd.read_csv(out / "per_query.csv")
    assert len(per_query) == 12 * 10
    (out / "report.md").unlink()
    assert _commands(["report", str(out)]) == 0
    assert (out / "report.md").read_text().count("| tiny |") == 13  # 1 best row + 12 in the dataset table


def test_recommend_writes_a_config_tinycontext_loads(sweep, tmp_path, capsys):
    out = sweep[0]
    target = tmp_path / "context_config.json"
    assert _commands(["recommend", str(out), "--max-p95-ms", "100000", "--max-model-mb", "1000", "--out", str(target)]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout[: stdout.rindex("}") + 1])
    rows = pd.read_csv(out / "results.csv")
    deployable = rows[rows["pooling"] == rows["model_pooling"]]
    assert summary["value"] == pytest.approx(deployable["ndcg@10"].max())
    config = load_config(target, env={})
    settings = json.loads(target.read_text())
    assert set(settings) == {"embedding_model", "recall_dense_weight", "recall_rrf_k", "recall_top_k", "recall_max_tokens",
                             "recall_candidates", "dense_query_prefix", "dense_document_prefix"}
    assert config.recall_max_tokens == 120 and config.recall_dense_weight == settings["recall_dense_weight"]

    assert _commands(["recommend", str(out), "--max-model-mb", "16", "--out", str(tmp_path / "small.json")]) == 0
    assert json.loads((tmp_path / "small.json").read_text())["embedding_model"].endswith("minilm-l6-static256")
    assert "wrote" in capsys.readouterr().out

    assert _commands(["recommend", str(out), "--max-p95-ms", "0.0001"]) == 2
    err = capsys.readouterr().err
    assert "config_error" in err and "Relax a limit" in err and not (out / "context_config.json").exists()

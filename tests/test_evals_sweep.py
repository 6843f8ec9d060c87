"""End to end: a real Hydra multirun of the harness on the shipped tiny dataset with the real
built-in model, then report, recommend, compare and a resumed sweep on its output."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from evals.report import choose, cost_table, split_matrix
from evals.run import _commands
from tinycontext import TinyContextConfig, load_config

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ["dataset", "embedder", "pooling", "query_prefix", "document_prefix", "dense_weight", "rrf_k", "ndcg@10",
            "ndcg@10_ci_low", "ndcg@10_ci_high", "recall@10", "recall@10_ci_low", "recall@10_ci_high", "tune_ndcg@10",
            "tune_ndcg@10_ci_low", "tune_ndcg@10_ci_high", "recall@100", "mrr@10", "index_docs_per_s", "recall_p50_ms",
            "recall_p95_ms", "recall_p99_ms", "tokens_returned", "tokens_naive", "token_savings", "budget_recall",
            "peak_rss_mb", "p_vs_default", "p_vs_default_holm", "p_vs_best", "p_vs_best_holm", "tied_with_best", "is_default",
            "tost_vs_best", "tost_vs_best_holm", "equivalent_to_best", "recall_p95_ms_ci_low", "recall_p95_ms_ci_high",
            "latency_flagged", "tuned_on_test"]
QUALITY = ["ndcg@10", "recall@10", "recall@100", "mrr@10", "budget_recall", "tune_ndcg@10", "tokens_returned"]
SWEEP = ["-m", "dataset=tiny", "embedder=fast,minilm-static256", "retrieval.dense_weight=0,0.5,1", "retrieval.rrf_k=10,60",
         "latency.queries=5", "latency.warmup=2", "latency.index_sample=20", "latency.passes=1", "latency.retries=0",
         "latency.max_competing_cores=1000"]  # a loaded test machine must not flag latency here


def cli(*args, env=None, check=True):
    result = subprocess.run([sys.executable, "-m", "evals.run", *args], check=False, cwd=REPO, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TINYCONTEXT_SHARED": str(REPO.parent / "shared"), **(env or {})})
    if check and result.returncode != 0:
        pytest.fail(f"evals.run {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    out = root / "sweep"
    result = cli(*SWEEP, f"hydra.sweep.dir={out}", env={"TINYCONTEXT_EVAL_CACHE": str(root / "cache")})
    return out, root / "cache", result.stdout + result.stderr


def test_sweep_writes_one_row_per_config(sweep):
    out, _, log = sweep
    rows = pd.read_csv(out / "results.csv")
    assert len(rows) == 12 and not set(REQUIRED) - set(rows.columns)
    assert set(rows["embedder"]) == {"fast", "minilm-static256"}
    assert rows[["ndcg@10", "recall@10", "recall@100", "mrr@10", "budget_recall"]].apply(lambda c: c.between(0, 1).all()).all()
    assert (rows["tokens_returned"] <= rows["max_tokens"]).all()
    # The naive baseline is fixed (BM25's top 10 in full): the same for every config.
    assert rows["tokens_naive"].nunique() == 1
    for m in ("ndcg@10", "recall@10", "tune_ndcg@10"):
        assert (rows[f"{m}_ci_low"] <= rows[m] + 1e-12).all() and (rows[m] <= rows[f"{m}_ci_high"] + 1e-12).all()
    # Exactly one config is what ships, and it is tied with itself only trivially: p vs default is NaN there.
    default = rows[rows["is_default"]]
    assert len(default) == 1 and default.iloc[0]["embedder"] == "fast" and pd.isna(default.iloc[0]["p_vs_default"])
    assert rows["tied_with_best"].any() and rows["is_best"].sum() == 1
    assert (rows["p_vs_best_holm"].dropna() >= rows["p_vs_best"].dropna() - 1e-12).all()
    assert (rows["recall_p50_ms"] <= rows["recall_p95_ms"]).all() and (rows["recall_p95_ms"] <= rows["recall_p99_ms"]).all()
    assert (rows["peak_rss_mb"] > 50).all() and (rows["index_docs_per_s"] > 0).all() and (rows["latency_queries"] == 5).all()
    # RAM and indexing throughput: the median of 3 fresh processes, probed once per model for the whole sweep.
    assert (rows["probe_runs"] == 3).all()
    assert ((rows["peak_rss_mb_min"] <= rows["peak_rss_mb"]) & (rows["peak_rss_mb"] <= rows["peak_rss_mb_max"])).all()
    assert (rows.groupby("embedder")[["peak_rss_mb", "index_docs_per_s"]].nunique() == 1).all().all()
    assert len(list(out.glob(".probe-*.json"))) == 2
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


def test_each_embedder_indexes_once_and_runs_keep_evidence(sweep):
    out, cache, _ = sweep
    assert len(list((cache / "indexes").glob("*.db"))) == 2
    records = [json.loads(p.read_text()) for p in out.glob("*/result.json")]
    built = [r for r in records if not r["row"]["index_reused"]]
    assert sorted(r["row"]["embedder"] for r in built) == ["fast", "minilm-static256"]
    assert all(r["row"]["index_embedded"] == 30 for r in built)
    manifest = records[0]["manifest"]
    assert manifest["packages"]["tinycontext"] and manifest["cpu"] and manifest["threads"]["env"] is not None
    assert len(manifest["load_average"]) == 3
    # Load was sampled during every timing pass (1-min load average, CPU of other processes).
    passes = records[0]["latency"]["passes"]
    assert passes and all(p["load1_before"] >= 0 and p["competing_cores"] >= 0 and len(p["ms"]) == 5 for p in passes)
    assert set(manifest["git"]) == {"commit", "dirty", "diff_sha256"} and manifest["code"]["engine"]
    assert all(len(r["content_sha256"]) == 64 for r in records)
    assert len(records[0]["model"]["sha256"]) == 64 and len(records[0]["dataset"]["fingerprint"]) == 64
    # Every run appended itself to the one results store.
    with sqlite3.connect(cache / "results.sqlite") as db:
        assert db.execute("SELECT count(*), count(DISTINCT job_key) FROM runs").fetchone() == (12, 12)


def test_report_plots_and_per_query(sweep):
    out = sweep[0]
    report = (out / "report.md").read_text()
    assert "## What was swept" in report and "`dense_weight`: 0.0, 0.5, 1.0" in report and "## tiny" in report
    assert "**recommended**" in report and "Holm" in report and "default (shipped) config" in report
    for name in ("pareto", "quality_vs_dense_weight", "tokens_vs_recall"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    per_query = pd.read_csv(out / "per_query.csv")
    assert len(per_query) == 12 * 18
    assert per_query.groupby("job")["tune"].sum().eq(8).all() and per_query.groupby("job")["test"].sum().eq(10).all()
    # Latency is timed on the test split's first 5 queries only, all live.
    assert per_query.groupby("job")["latency_ms"].count().eq(5).all()
    (out / "report.md").unlink()
    assert _commands(["report", str(out)]) == 0
    assert (out / "report.md").is_file()


def test_recommend_chooses_on_tuning_split_and_reports_test(sweep, tmp_path, capsys):
    out = sweep[0]
    target = tmp_path / "context_config.json"
    assert _commands(["recommend", str(out), "--max-p95-ms", "100000", "--max-model-mb", "1000", "--out", str(target)]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout[: stdout.rindex("}") + 1])
    rows = pd.read_csv(out / "results.csv", dtype={"job": str})
    per_query = pd.read_csv(out / "per_query.csv", dtype={"job": str, "query_id": str})
    deployable = rows[rows["pooling"] == rows["model_pooling"]]
    default = deployable[deployable["is_default"]]["job"].iloc[0]
    expected = choose(split_matrix(per_query, deployable["job"], "ndcg@10"), default, cost_table(deployable, per_query))
    assert summary["job"] == expected
    chosen = rows[rows["job"] == expected].iloc[0]
    assert summary["tune"]["value"] == pytest.approx(chosen["tune_ndcg@10"]) and summary["tune"]["split"] == "train"
    assert summary["test"]["value"] == pytest.approx(chosen["ndcg@10"]) and summary["test"]["split"] == "test"
    config = load_config(target, env={})
    written = json.loads(target.read_text())
    assert written["provenance"]["chosen_on"]["value_ci_low"] <= written["provenance"]["chosen_on"]["value"]
    assert config.recall_dense_weight == written["recall_dense_weight"] == chosen["dense_weight"]

    assert _commands(["recommend", str(out), "--max-model-mb", "16", "--out", str(tmp_path / "small.json")]) == 0
    small = json.loads((tmp_path / "small.json").read_text())
    # Portable: the bundle folder relative to the config file, which load_config resolves against it.
    assert small["embedding_model"].startswith("./") and small["embedding_model"].endswith("minilm-l6-static256")
    assert Path(load_config(tmp_path / "small.json", env={}).embedding_model).is_dir()
    assert "wrote" in capsys.readouterr().out

    assert _commands(["recommend", str(out), "--max-p95-ms", "0.0001"]) == 2
    err = capsys.readouterr().err
    assert "config_error" in err and "Relax a limit" in err and not (out / "context_config.json").exists()
    # The summary says which rule chose.
    assert summary["rule"].startswith(("default kept", "best", "cost")) and written["provenance"]["rule"] == summary["rule"]


def test_compare_gives_paired_differences(sweep, capsys):
    out = sweep[0]
    rows = pd.read_csv(out / "results.csv", dtype={"job": str})
    bm25 = rows[(rows["dense_weight"] == 0) & (rows["embedder"] == "fast")]["job"].iloc[0]
    hybrid = rows[rows["is_default"]]["job"].iloc[0]
    from evals.compare import compare

    table = compare(str(out / bm25), str(out / hybrid)).set_index(["split", "metric"])
    expected = rows.set_index("job").loc[hybrid, "ndcg@10"] - rows.set_index("job").loc[bm25, "ndcg@10"]
    row = table.loc[("test", "ndcg@10")]
    assert row["b_minus_a"] == pytest.approx(expected) and row["queries"] == 10
    assert row["ci_low"] <= row["b_minus_a"] <= row["ci_high"] and 0 <= row["p"] <= 1
    assert _commands(["compare", str(out / bm25), str(out / hybrid)]) == 0
    assert "b_minus_a" in capsys.readouterr().out


def test_repeated_sweep_resumes_and_force_reruns(sweep, tmp_path):
    out, cache, _ = sweep
    again = tmp_path / "again"
    log = cli(*SWEEP, f"hydra.sweep.dir={again}", env={"TINYCONTEXT_EVAL_CACHE": str(cache)})
    text = log.stdout + log.stderr
    assert text.count("already finished (run") == 12
    # Taken from the store by the launching process: no job reached the launcher (no job ran Hydra's job setup).
    assert "12 of 12 jobs already finished" in text and "Launching" not in text
    assert not list(again.glob("*/.hydra"))
    first, second = pd.read_csv(out / "results.csv"), pd.read_csv(again / "results.csv")
    assert first.sort_values("job")[QUALITY].equals(second.sort_values("job")[QUALITY])
    # Finished and new jobs interleaved: only the new ones are launched, each in its own job number's directory.
    mixed = tmp_path / "mixed"
    log = cli("-m", "dataset=tiny", "retrieval.dense_weight=0,1", "retrieval.rrf_k=10,30", "latency.queries=5",
              "latency.warmup=2", "latency.index_sample=20", "latency.passes=1", "latency.retries=0",
              "latency.max_competing_cores=1000", f"hydra.sweep.dir={mixed}", env={"TINYCONTEXT_EVAL_CACHE": str(cache)})
    assert "2 of 4 jobs already finished" in log.stdout + log.stderr
    for job, (weight, k, reused) in enumerate([(0, 10, True), (0, 30, False), (1, 10, True), (1, 30, False)]):
        record = json.loads((mixed / str(job) / "result.json").read_text())
        assert (record["row"]["dense_weight"], record["row"]["rrf_k"], "reused_run" in record) == (weight, k, reused)
        assert (mixed / str(job) / ".hydra").is_dir() != reused
    forced = tmp_path / "forced"
    cli("dataset=tiny", "force=true", "latency.queries=5", "latency.warmup=2", "latency.index_sample=20", "latency.passes=1",
        "latency.retries=0", "latency.max_competing_cores=1000", f"hydra.run.dir={forced}", env={"TINYCONTEXT_EVAL_CACHE": str(cache)})
    record = json.loads((forced / "result.json").read_text())
    assert "reused_run" not in record
    with sqlite3.connect(cache / "results.sqlite") as db:
        assert db.execute("SELECT count(*) FROM runs WHERE job_key = ?", (record["job_key"],)).fetchone()[0] == 2


def test_candidates_is_the_ranking_depth(tmp_path):
    out = tmp_path / "cand"
    cli("-m", "dataset=tiny", "retrieval.candidates=3,100", "latency.queries=3", "latency.warmup=1",
        "latency.index_sample=10", "latency.passes=1", "latency.retries=0", f"hydra.sweep.dir={out}", env={"TINYCONTEXT_EVAL_CACHE": str(tmp_path / "cache")})
    rows = pd.read_csv(out / "results.csv").set_index("candidates")
    # 3 candidates per list cannot find what 100 do: the axis changes quality, not only latency.
    assert rows.loc[3, "recall@100"] < rows.loc[100, "recall@100"]


@pytest.mark.parametrize("overrides", [
    ["retrieval.dense_weight=0.3", "retrieval.rrf_k=30", "experiment=scifact_sweep"],
    ["dataset=tiny", "embedder=minilm-static256", "retrieval.dense_weight=1", "budget=tight", "+engine.recall.recall_min_dense=0.2"],
    ["+retrieval.kwargs={speaker_boost: 0.5}", "embedder=fast", "latency.queries=5", "retrieval.top_k=5"],
])
def test_reusing_sweeper_composes_jobs_as_hydra_does(overrides):
    """The sweeper composes once per set of group choices and applies value overrides itself: the job
    config (and what Hydra records of its overrides) must equal Hydra's own composition."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext, RunMode
    from hydra_plugins.tinycontext_eval.reusing_sweeper import _SkipFinished

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", overrides=["hydra.sweep.dir=/tmp/x"], run_mode=RunMode.MULTIRUN)
        fast = _SkipFinished(None, HydraContext(config_loader=loader, callbacks=None), master)
        for _ in range(2):  # the second time from the composed cache
            ours, hydras = fast._job_config(overrides), loader.load_sweep_config(master, list(overrides))
            for cfg in (ours, hydras):
                cfg.hydra.job.num = 3
            seen = [(OmegaConf.to_container(OmegaConf.masked_copy(c, [k for k in c if k != "hydra"]), resolve=True),
                     OmegaConf.to_container(c.hydra.overrides), c.hydra.sweep.dir, c.hydra.sweep.subdir,
                     c.hydra.job.override_dirname) for c in (ours, hydras)]
            assert seen[0] == seen[1]


def test_cost_rule_on_real_data_picks_the_cheaper_equivalent_model(shared_dir, tmp_path, capsys):
    """Two real LoCoMo conversations, all-MiniLM-L6-v2 fp32 against its int8 export (a quarter of the size, neither
    the default config): equivalent within the TOST margin, so the rule picks by cost and names itself."""
    samples = json.loads((shared_dir / "datasets" / "locomo" / "locomo-dev.json").read_text(encoding="utf-8"))
    data = tmp_path / "locomo-two.json"
    data.write_text(json.dumps([s for s in samples if s["sample_id"] in ("conv-26", "conv-30")]), encoding="utf-8")
    out = tmp_path / "sweep"
    cli("-m", "dataset=locomo", f"dataset.path={data}", "embedder=minilm-fp32,minilm-int8", *SWEEP[5:],
        f"hydra.sweep.dir={out}", env={"TINYCONTEXT_EVAL_CACHE": str(tmp_path / "cache")})
    rows = pd.read_csv(out / "results.csv", dtype={"job": str}).set_index("embedder")
    assert not rows["is_default"].any() and rows["equivalent_to_best"].all()
    assert rows.loc["minilm-int8", "model_mb"] < rows.loc["minilm-fp32", "model_mb"] / 3
    assert _commands(["recommend", str(out), "--out", str(tmp_path / "context_config.json")]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout[: stdout.rindex("}") + 1])
    assert summary["rule"].startswith("cost") and summary["job"] == rows.loc["minilm-int8", "job"]
    assert "cost: the cheapest" in (out / "report.md").read_text(encoding="utf-8")

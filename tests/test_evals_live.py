"""Costs are measured live and caches cannot go stale: a slower query embedder shows in the latency
even when every vector is cached; a changed loader text function misses every cache and scores
differently; timing passes exclude computing jobs."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import evals.run  # noqa: F401  (registers the tc_default resolver)
from evals.runner import run_config
from evals.timing import LOCK_FILE, computing, timing_alone
from tinycontext import Embedder

REPO = Path(__file__).resolve().parents[1]
SLOW_MS = 40.0


def compose_run(cache: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"cache_dir={cache}", f"base_dir={REPO}", "latency.queries=6",
                                            "latency.warmup=2", "latency.index_sample=10", "latency.probe_runs=1", "latency.passes=1",
                                            "latency.retries=0", *overrides])


def test_latency_comes_from_live_recalls_not_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = run_config(compose_run(cache), tmp_path / "first")
    assert first["embedding_cache"]["computed"] > 0
    # Every vector is now cached. Make the real query embedder slow: only a live measurement sees it.
    real_embed = Embedder.embed

    def slow_embed(self, texts, kind, **kwargs):
        if kind == "query":
            time.sleep(SLOW_MS / 1000)
        return real_embed(self, texts, kind, **kwargs)

    monkeypatch.setattr(Embedder, "embed", slow_embed)
    # Other latency settings are another job (they are in its key); its quality pass reads the cache.
    again = run_config(compose_run(cache, "latency.warmup=3"), tmp_path / "again")
    assert again["embedding_cache"]["computed"] == 0  # the quality pass took every vector from the cache
    assert again["row"]["recall_p50_ms"] >= SLOW_MS and again["row"]["recall_p99_ms"] >= SLOW_MS
    for metric in ("ndcg@10", "tune_ndcg@10", "recall@10", "budget_recall", "tokens_returned"):
        assert again["row"][metric] == first["row"][metric]
    # The vector cache holds vectors only: no stored timing that could be replayed.
    (db,) = (cache / "embeddings").glob("*.sqlite")
    with sqlite3.connect(db) as conn:
        assert [c[1] for c in conn.execute("PRAGMA table_info(vectors)")] == ["key", "vector"]


LOADER = '''
from evals.datasets import load_tiny


def doc_text(text: str) -> str:
    return {body}


def load(tune_split="train", test_split="test", name="tiny"):
    dataset = load_tiny(tune_split=tune_split, test_split=test_split, name=name)
    for doc in dataset.docs:
        doc.text = doc_text(doc.text)
    return dataset
'''


def test_changing_a_loader_text_function_misses_every_cache(tmp_path):
    package = tmp_path / "loaders"
    package.mkdir()
    module = package / "tc_custom_loader.py"
    cache = tmp_path / "cache"

    def run(body: str, out: Path) -> tuple[dict, str]:
        module.write_text(LOADER.format(body=body), encoding="utf-8")
        result = subprocess.run(
            [sys.executable, "-m", "evals.run", "dataset._target_=tc_custom_loader.load", "latency.queries=3",
             "latency.warmup=1", "latency.index_sample=10", "latency.probe_runs=1", "latency.passes=1", "latency.retries=0",
             f"hydra.run.dir={out}"],
            cwd=REPO, capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")]),
                 "TINYCONTEXT_EVAL_CACHE": str(cache)})
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads((out / "result.json").read_text()), result.stdout + result.stderr

    full, _ = run("text", tmp_path / "full")
    same, log = run("text", tmp_path / "same")
    assert "already finished" in log and same["row"]["ndcg@10"] == full["row"]["ndcg@10"]
    # Only the first word of each document is kept: the old index and results must not be reused.
    cut, log = run("text.split()[0]", tmp_path / "cut")
    assert "already finished" not in log and not cut["row"]["index_reused"]
    assert cut["job_key"] != full["job_key"] and len(list((cache / "indexes").glob("*.db"))) == 2
    assert cut["row"]["ndcg@10"] < full["row"]["ndcg@10"]


def test_timing_pass_runs_alone(tmp_path):
    try_exclusive = ("import fcntl, sys\nf = open(sys.argv[1], 'a+')\n"
                     "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)\n")
    try_shared = try_exclusive.replace("LOCK_EX", "LOCK_SH")

    def other_job(code: str) -> int:
        return subprocess.run([sys.executable, "-c", code, str(tmp_path / LOCK_FILE)], timeout=60).returncode

    with computing(tmp_path):
        assert other_job(try_shared) == 0  # computing jobs run side by side
        assert other_job(try_exclusive) == 3  # but nobody times while one computes
    with timing_alone(tmp_path):
        assert other_job(try_shared) == 3 and other_job(try_exclusive) == 3
    assert other_job(try_exclusive) == 0
    with open(tmp_path / LOCK_FILE, "a+") as fh:  # released: this process can take it too
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.fixture(autouse=True)
def _fresh_hydra():
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


def test_budget_as_rendered_counts_what_a_client_receives(tmp_path):
    import pandas as pd

    cache = tmp_path / "cache"
    runs = {}
    for rendered in ("false", "true"):
        run_config(compose_run(cache, "budget.max_tokens=100", f"budget.rendered={rendered}"), tmp_path / rendered)
        runs[rendered] = pd.read_csv(tmp_path / rendered / "per_query.csv").set_index("query_id")
    library, page = runs["false"], runs["true"]
    assert (page["tokens_returned"] <= 100).all() and (library["tokens_returned"] <= 100).all()
    # The same ranking; the rendered page also pays for its formatting, so it holds fewer memories.
    assert (page["recall@10"] == library["recall@10"]).all()
    assert (page["memories_returned"] <= library["memories_returned"]).all()
    assert page["memories_returned"].sum() < library["memories_returned"].sum()


def test_configs_sharing_one_search_score_exactly_as_searching_afresh(tmp_path, monkeypatch):
    """The quality pass reuses each query's search across configs that differ in fusion, floor, cliff
    or budget (as a sweep's jobs do, through a file beside the index); every per-query figure equals
    a fresh search's."""
    from evals import models, runner
    from tinycontext import MemoryEngine, TinyContextConfig

    cfg = compose_run(tmp_path / "cache")
    models_dir = (REPO / Path(cfg.models_dir).expanduser()).resolve()
    dataset = runner.get_dataset(cfg.dataset, REPO)
    embedder = models.cached_embedder(models.describe(cfg.embedder, models_dir, REPO), tmp_path / "cache", models_dir)
    db, index = runner.ensure_index(dataset, embedder, tmp_path / "cache", {})
    searched = []
    real_search = MemoryEngine.search
    monkeypatch.setattr(MemoryEngine, "search", lambda self, *a, **k: searched.append(a) or real_search(self, *a, **k))
    configs = [{}, {"dense_weight": 0.0}, {"dense_weight": 1.0}, {"dense_weight": 0.3, "rrf_k": 60},
               {"kwargs": {"min_dense": 0.6, "score_cliff": 0.5}}, {"kwargs": {"min_dense": 0.0, "score_cliff": 0.0}},
               {"top_k": 2}, {"candidates": 3}]
    with MemoryEngine(TinyContextConfig(memory_db_path=db), embedder=embedder) as engine:
        for settings in configs:
            r = cfg.retrieval.copy()
            for key, value in settings.items():
                r[key] = value
            found = runner.searches(engine, dataset, db, {}, r)
            shared, shared_run = runner._quality_pass(engine, dataset, index["doc_ids"], index["naive_tokens"], r, 60, found=found)
            fresh, fresh_run = runner._quality_pass(engine, dataset, index["doc_ids"], index["naive_tokens"], r, 60)
            # The dense cosines per query (calibrate-floor) come from the searches: a fresh pass has none.
            dense = ("dense_relevant_max", "dense_other_max")
            assert [{k: v for k, v in row.items() if k not in dense} for row in shared] == \
                [{k: v for k, v in row.items() if k not in dense} for row in fresh] and shared_run == fresh_run, settings
        # Searched once per candidates depth (100, then 3); the fresh passes searched inside recall.
        assert len(searched) == len(shared) * 2
        # Another process reads the same searches from the file beside the index.
        monkeypatch.setattr(runner, "_searches", {"file": None, "by_query": {}})
        assert runner.searches(engine, dataset, db, {}, r) == found and len(searched) == len(shared) * 2
    assert len(list(db.parent.glob(f"{db.stem}.searches-*.json"))) == 2

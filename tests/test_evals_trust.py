"""Nothing stored is replayed unchecked: a job's TREC run files score the same with ir_measures, every
edited record, file or store row is refused by name, force recomputes every cache; decision rules
(TOST, cost pick, tune-on-test refusal), timing-pass load flags, foreign TREC runs in compare, SQL on
the results store, the BEIR / LongMemEval loaders on fixtures in their formats, and a harness run
against an OpenAI-compatible server (a local test server serving the real MiniLM's vectors)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import ir_measures
import numpy as np
import pandas as pd
import pytest
from fake_embed_server import embed_server
from hydra import compose, initialize_config_dir
from ir_measures import RR, R, nDCG

import evals.run  # noqa: F401  (registers the tc_default resolver)
from evals import runner
from evals.datasets import load_beir, load_longmemeval
from evals.records import TamperedError, job_files, seal
from evals.compare import compare
from evals.report import build_report, cost_front, cost_table, decision, load_results
from evals.store import ResultsStore
from evals.timing import timing_passes
from tinycontext import ConfigError

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def compose_run(cache: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"cache_dir={cache}", f"base_dir={REPO}", "latency.queries=4", "latency.warmup=1",
                                            "latency.index_sample=8", "latency.probe_runs=1", "latency.passes=1",
                                            "latency.retries=0", *overrides])


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    record = runner.run_config(compose_run(root / "cache"), root / "job")
    return root, record


def test_the_trec_run_file_scores_the_same_with_ir_measures(job):
    root, record = job
    folder = root / "job"
    measures = {"ndcg@10": nDCG @ 10, "recall@10": R @ 10, "recall@100": R @ 100, "mrr@10": RR @ 10}
    for split, prefix in (("test", ""), ("train", "tune_")):
        run = list(ir_measures.read_trec_run(str(folder / f"run.{split}.trec")))
        qrels = list(ir_measures.read_trec_qrels(str(folder / f"qrels.{split}.trec")))
        scores = ir_measures.calc_aggregate(list(measures.values()), qrels, run)
        for name, measure in measures.items():
            assert scores[measure] == pytest.approx(record["row"][prefix + name], abs=1e-12), (split, name)
    # Full depth: every document each query's ranking held (the per-query top 10 is its head), ranks 1..n.
    lines = [line.split() for line in (folder / "run.test.trec").read_text().splitlines()]
    depth = {q: [int(f[3]) for f in lines if f[0] == q] for q in dict.fromkeys(f[0] for f in lines)}
    assert all(ranks == list(range(1, len(ranks) + 1)) for ranks in depth.values())
    per_query = pd.read_csv(folder / "per_query.csv", dtype={"query_id": str, "retrieved": str}).set_index("query_id")
    for qid in depth:
        assert [f[2] for f in lines if f[0] == qid][:10] == str(per_query.loc[qid, "retrieved"]).split(";")


def _copy(root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(root / "job", target)
    return target


def test_an_edited_record_or_file_is_refused_by_name(job):
    root, _ = job
    rows, _, _ = load_results(root / "job")  # untouched: loads
    assert len(rows) == 1
    edits = {
        "result.json": None,  # below: a stored figure, p95 0.1 ms instead of what was measured
        "per_query.csv": lambda t: t.replace(",", ",9", 1),
        "run.test.trec": lambda t: t.replace(" 1 ", " 2 ", 1),
        "qrels.test.trec": lambda t: t + "q01 0 d01 1\n",
    }
    for name, edit in edits.items():
        folder = _copy(root, f"edit-{name}")
        file = folder / name
        if edit is None:
            record = json.loads(file.read_text())
            record["row"]["recall_p95_ms"] = 0.1
            file.write_text(json.dumps(record))
        else:
            file.write_text(edit(file.read_text()))
        with pytest.raises(TamperedError) as info:
            load_results(folder)
        assert str(folder) in str(info.value) and (name == "result.json" or name in str(info.value))
        with pytest.raises(TamperedError):
            build_report(folder)
        assert not (folder / "report.md").exists()
    crude = _copy(root, "crude")
    (crude / "result.json").write_text("{not json")
    with pytest.raises(TamperedError, match="not a readable job record"):
        build_report(crude)


def test_a_resealed_figure_still_has_to_match_its_rankings(job):
    """Whoever recomputes the hash still cannot change a figure: the report derives it from the run file."""
    root, _ = job
    folder = _copy(root, "resealed")
    record = json.loads((folder / "result.json").read_text())
    record["row"]["ndcg@10"] = 0.9263
    (folder / "result.json").write_text(json.dumps(seal(record, job_files(folder))))
    with pytest.raises(TamperedError, match="ndcg@10.*derived from its per-query rankings"):
        load_results(folder)


def test_the_store_is_sql_and_a_poisoned_row_is_refused(job, tmp_path):
    root, record = job
    store_path = root / "cache" / "results.sqlite"
    with sqlite3.connect(store_path) as db:
        mean = db.execute("SELECT avg(value) FROM per_query WHERE run_id = ? AND metric = 'ndcg@10' AND split = 'test'",
                          (record["run_id"],)).fetchone()[0]
        depth = db.execute("SELECT max(rank) FROM rankings WHERE run_id = ? AND split = 'test'", (record["run_id"],)).fetchone()[0]
        stored = db.execute("""SELECT json_extract(row_json, '$."ndcg@10"') FROM runs WHERE run_id = ?""",
                            (record["run_id"],)).fetchone()[0]
    assert mean == pytest.approx(record["row"]["ndcg@10"]) and stored == pytest.approx(mean) and depth >= 1
    cfg = compose_run(root / "cache")
    assert runner.reuse_finished(cfg, tmp_path / "reused") is not None  # the untouched job is reused
    with sqlite3.connect(store_path) as db:
        db.execute("""UPDATE runs SET record_json = json_set(record_json, '$.row."recall_p95_ms"', 0.1) WHERE run_id = ?""",
                   (record["run_id"],))
    with pytest.raises(TamperedError, match=f"run {record['run_id']}"):
        runner.reuse_finished(cfg, tmp_path / "poisoned")


def test_force_recomputes_every_cache(job, tmp_path):
    root, record = job
    cache = root / "cache"
    (index,) = [p for p in (cache / "indexes").glob("*.json") if ".searches-" not in p.name]
    meta = json.loads(index.read_text())
    ids = list(meta["doc_ids"].values())
    meta["doc_ids"] = dict(zip(meta["doc_ids"], ids[::-1]))  # every memory credited to another document
    meta["build_seconds"] = 1e-6
    index.write_text(json.dumps(meta))
    for searches in (cache / "indexes").glob("*.searches-*.json"):
        kept = json.loads(searches.read_text())
        for signals in kept["searches"].values():
            signals["dense"] = []
        searches.write_text(json.dumps(kept))
    (vectors,) = (cache / "embeddings").glob("*.sqlite")
    with sqlite3.connect(vectors) as db:
        db.execute("UPDATE vectors SET vector = zeroblob(length(vector))")
    # Without force the poisoned caches would score (the store is skipped by another latency setting).
    poisoned = runner.run_config(compose_run(cache, "latency.warmup=2"), tmp_path / "poisoned")
    assert poisoned["row"]["ndcg@10"] != record["row"]["ndcg@10"]
    forced = runner.run_config(compose_run(cache, "force=true"), tmp_path / "forced")
    assert "reused_run" not in forced and not forced["row"]["index_reused"] and forced["row"]["index_embedded"] == 30
    for name in ("ndcg@10", "tune_ndcg@10", "recall@100", "budget_recall", "tokens_returned"):
        assert forced["row"][name] == pytest.approx(record["row"][name]), name
    assert forced["row"]["index_build_seconds"] > 1e-6 and forced["embedding_cache"]["computed"] > 30


def test_a_jobs_cost_figures_are_keyed_by_settings_host_and_packages(tmp_path, monkeypatch):
    """A finished job is reused only where its latency, RSS and rates were measured the same way."""
    cfg = compose_run(tmp_path)
    dataset = runner.get_dataset(cfg.dataset, REPO)
    key = runner.job_key(cfg, dataset, "vectors")
    for setting in ("latency.queries=5", "latency.passes=2", "latency.probe_runs=2", "latency.index_sample=9"):
        assert runner.job_key(compose_run(tmp_path, setting), dataset, "vectors") != key, setting
    assert runner.job_key(compose_run(tmp_path / "elsewhere"), dataset, "vectors") == key  # where caches live is not
    # what a bundle states that recall reads, with the same model file (its fusion weights, its cliff for turns)
    assert runner.job_key(cfg, dataset, "vectors", {"turn_score_cliff": 0.28}) != key
    assert runner.job_key(cfg, dataset, "vectors", {"fusion_weights": (1.0,)}) != runner.job_key(cfg, dataset, "vectors", {"fusion_weights": (2.0,)})
    monkeypatch.setattr(runner.socket, "gethostname", lambda: "another-host")
    assert runner.job_key(cfg, dataset, "vectors") != key
    monkeypatch.undo()
    real = runner.environment()
    for package in ("sqlite-vec", "tokenizers", "tiktoken"):
        monkeypatch.setattr(runner, "environment", lambda: {**real, "packages": {**real["packages"], package: "0.0.0"}})
        assert runner.job_key(cfg, dataset, "vectors") != key, package
        monkeypatch.undo()
    assert runner.job_key(cfg, dataset, "vectors") == key


def test_what_a_bundle_states_is_part_of_its_jobs_key(tmp_path):
    """Two bundle folders with one model file but another stated cliff for turns are not one job."""
    import json
    import shutil

    from evals import models
    from tinycontext.models.hub import resolve_model

    made = resolve_model("fast", tmp_path / "models")  # the default, made from the package
    described = []
    for name, cliff in (("a", 0.28), ("b", 0.5)):
        folder = tmp_path / name
        folder.mkdir()
        for source in (made.model_file, made.tokenizer_file, *made.path.glob("*.json")):
            shutil.copy(source, folder / source.name)
        config = json.loads((folder / "model_config.json").read_text())
        (folder / "model_config.json").write_text(json.dumps({**config, "turn_score_cliff": cliff}))
        described.append(models.describe(compose_run(tmp_path, f"embedder.model={folder}").embedder, tmp_path / "models", REPO))
    a, b = described
    assert a.vectors == b.vectors and (a.stated["turn_score_cliff"], b.stated["turn_score_cliff"]) == (0.28, 0.5)
    cfg = compose_run(tmp_path)
    dataset = runner.get_dataset(cfg.dataset, REPO)
    assert runner.job_key(cfg, dataset, a.vectors, a.stated) != runner.job_key(cfg, dataset, b.vectors, b.stated)


def test_tuning_on_the_test_split_is_refused_unless_allowed(tmp_path):
    cfg = compose_run(tmp_path, "dataset.tune_split=test")
    dataset = runner.get_dataset(cfg.dataset, REPO)
    with pytest.raises(ConfigError, match="allow_test_tuning=true"):
        runner.check_splits(cfg, dataset)
    assert runner.check_splits(compose_run(tmp_path, "dataset.tune_split=test", "allow_test_tuning=true"), dataset) is True
    assert runner.check_splits(compose_run(tmp_path), runner.get_dataset(compose_run(tmp_path).dataset, REPO)) is False


def test_a_run_tuned_on_test_says_so_on_every_output(tmp_path):
    from evals.report import recommend

    runs = tmp_path / "runs"
    runner.run_config(compose_run(tmp_path / "cache", "dataset.tune_split=test", "allow_test_tuning=true"), runs / "0")
    rows, _, _ = load_results(runs)
    assert rows["tuned_on_test"].all()
    assert "TUNED ON TEST" in build_report(runs).read_text(encoding="utf-8")
    _, summary = recommend(runs, out=tmp_path / "chosen.json")
    assert summary["tuned_on_test"] is True
    assert json.loads((tmp_path / "chosen.json").read_text())["provenance"]["tuned_on_test"] is True


def test_equivalent_configs_are_chosen_by_cost():
    rng = np.random.default_rng(7)
    base = rng.uniform(0.3, 0.9, 400)
    matrix = pd.DataFrame({"fp32": base, "int8": base + rng.normal(0, 0.001, 400), "bm25": base - 0.05,
                           "static": base - 0.001 + rng.normal(0, 0.1, 400)})
    costs = pd.DataFrame({"model_mb": [90, 23, 0, 15], "tokens_returned": [1700, 1700, 1900, 1700],
                          "recall_p95_ms": [9.0, 8.0, 2.0, np.nan], "peak_rss_mb": [600, 450, 300, 250]},
                         index=["fp32", "int8", "bm25", "static"])
    pick = decision(matrix, "fp32", costs)
    # int8 is equivalent within 0.005 and cheaper on every cost: it replaces the default.
    assert "int8" in pick["equivalent"] and "bm25" not in pick["equivalent"] and "static" not in pick["equivalent"]
    assert pick["front"] == ["int8"] and pick["job"] == "int8" and pick["rule"].startswith("cost")
    assert decision(matrix, "int8", costs)["rule"].startswith("default kept")
    # Equivalence is not "not significantly different": the noisy static config is neither.
    assert decision(matrix[["fp32", "bm25"]], None, costs.loc[["fp32", "bm25"]])["rule"].startswith("best")
    # A latency measured under load (NaN) decides nothing: the other axes do.
    assert cost_front(costs.loc[["int8", "static"]]) == ["static"]


def test_timing_passes_are_retried_and_flagged_under_load():
    calls = []

    def measure():
        calls.append(1)
        return [1.0, 2.0, 3.0]

    quiet = timing_passes(measure, passes=3, max_competing_cores=1e9, retries=2, pause_s=0)
    assert len(quiet) == 3 and not any(p["loaded"] for p in quiet)
    assert all(p["competing_cores"] >= 0 and p["load1_before"] >= 0 and p["ms"] == [1.0, 2.0, 3.0] for p in quiet)
    loaded = timing_passes(measure, passes=3, max_competing_cores=-1, retries=2, pause_s=0)
    assert len(loaded) == 5 and all(p["loaded"] for p in loaded) and len(calls) == 8
    from evals.records import latency_figures

    mixed = latency_figures({"passes": [{"ms": [100.0] * 4, "loaded": True}, {"ms": [1.0, 2.0, 3.0, 4.0], "loaded": False}]})
    assert mixed["recall_p95_ms"] < 5 and mixed["latency_passes_loaded"] == 1 and not mixed["latency_flagged"]
    assert mixed["recall_p95_ms_ci_low"] <= mixed["recall_p95_ms"] <= mixed["recall_p95_ms_ci_high"]
    assert latency_figures({"passes": [{"ms": [100.0] * 4, "loaded": True}]})["latency_flagged"]


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="VmHWM is Linux's")
def test_a_probes_peak_rss_is_its_own_not_its_launchers():
    """exec carries the launching process's high-water mark into the child's ru_maxrss: a probe started
    by a worker that had built an index reported the worker's peak. The probe reads its own."""
    import subprocess
    import sys

    ballast = bytearray(600 * 2**20)
    ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))  # every page touched: resident
    code = ("import json, resource; from evals.probe import peak_rss_mb; "
            "print(json.dumps([peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    own, with_launcher = json.loads(done.stdout.splitlines()[-1])
    del ballast
    assert with_launcher > 600  # the trap is real here
    assert 0 < own < 300


def test_a_p95_measured_under_load_meets_no_latency_limit_and_decides_no_cost(tmp_path):
    from evals.report import recommend

    # Every pass counts as loaded (any competing CPU is over a negative threshold): the job is flagged.
    runner.run_config(compose_run(tmp_path / "cache", "latency.max_competing_cores=-1"), tmp_path / "runs" / "0")
    rows, per_query, _ = load_results(tmp_path / "runs")
    assert rows["latency_flagged"].all() and rows["recall_p95_ms"].notna().all()
    assert cost_table(rows, per_query)["recall_p95_ms"].isna().all()  # not a cost the pick weighs
    with pytest.raises(ConfigError, match="external load: 1"):
        recommend(tmp_path / "runs", max_p95_ms=1e9, out=tmp_path / "limited.json")
    recommend(tmp_path / "runs", out=tmp_path / "chosen.json")  # without a latency limit it is chosen
    assert json.loads((tmp_path / "chosen.json").read_text())["provenance"]["latency_flagged"] is True


def test_compare_accepts_another_systems_trec_run(job, tmp_path):
    root, record = job
    folder = root / "job"
    same = tmp_path / "same.trec"
    same.write_text((folder / "run.train.trec").read_text().replace("tinycontext", "other")
                    + (folder / "run.test.trec").read_text().replace("tinycontext", "other"))
    table = compare(str(folder), str(same)).set_index(["split", "metric"])
    assert (table["b_minus_a"].abs() < 1e-12).all() and table.loc[("test", "ndcg@10"), "queries"] == 10
    # Another system: every query ranks the 30 documents by id, descending.
    qids = [line.split()[0] for line in (folder / "qrels.test.trec").read_text().splitlines()]
    other = tmp_path / "by_id.trec"
    other.write_text("".join(f"{q} Q0 d{30 - i:02d} {i + 1} {30 - i} byid\n" for q in dict.fromkeys(qids) for i in range(30)))
    table = compare(str(folder), str(other)).set_index(["split", "metric"])
    expected = ir_measures.calc_aggregate([nDCG @ 10], list(ir_measures.read_trec_qrels(str(folder / "qrels.test.trec"))),
                                          list(ir_measures.read_trec_run(str(other))))[nDCG @ 10]
    row = table.loc[("test", "ndcg@10")]
    assert row["b"] == pytest.approx(expected) and row["a"] == pytest.approx(record["row"]["ndcg@10"]) and row["b"] < row["a"]
    assert "budget_recall" not in table.index.get_level_values(1)  # a TREC run says nothing of the token budget


def test_beir_sets_with_a_dev_split_or_a_test_split_only():
    dev = load_beir(FIXTURES / "beir_devsplit", tune_split="auto")  # gzipped corpus, dev split, a doc without title
    assert dev.tune_split == "dev" and dev.split_ids("dev") == ["PLAIN-1", "PLAIN-2"]
    assert len(dev.docs) == 4 and dev.docs[3].text == "Omega-3 fatty acids lower triglyceride levels."
    assert dev.qrels["PLAIN-4"] == {"MED-3": 1, "MED-1": 0} and dev.split_ids("test") == ["PLAIN-3", "PLAIN-4"]
    with pytest.raises(ConfigError, match="allow_test_tuning=true"):
        load_beir(FIXTURES / "beir_testonly", tune_split="auto")
    assert load_beir(FIXTURES / "beir_testonly", tune_split="test").judged == ["PLAIN-3"]


def test_longmemeval_sessions_turns_and_abstention():
    file = FIXTURES / "longmemeval" / "longmemeval_s_sample.json"
    sessions = load_longmemeval(file)
    assert set(sessions.queries) == {"q-pref-1", "q-city-2"}  # the _abs question has nothing to retrieve
    assert sessions.qrels["q-city-2"] == {"q-city-2/s7": 1, "q-city-2/s8": 1}
    assert sessions.query_sessions["q-pref-1"] == "q-pref-1" and len(sessions.docs) == 5
    assert sessions.docs[0].text.startswith("user: I always start my morning with a cup of green tea.")
    turns = load_longmemeval(file, granularity="turn")
    assert turns.qrels["q-pref-1"] == {"q-pref-1/s1/0": 1} and len(turns.docs) == 9
    assert set(turns.split_ids("dev")) | set(turns.split_ids("test")) == {"q-pref-1", "q-city-2"}
    assert turns.docs[1].fields == {"speaker": "assistant"}


def test_a_sweep_against_an_openai_compatible_server(real_embedder, tmp_path):
    with embed_server(real_embedder) as server:
        cfg = compose_run(tmp_path / "cache", "embedder=openai", f"embedder.url={server.url}", "embedder.model=minilm-test",
                          "+embedder.query_params={input_type: query}", "+embedder.document_params={input_type: passage}")
        record = runner.run_config(cfg, tmp_path / "remote")
        kinds = {r.get("input_type") for r in server.requests}
    assert kinds == {"query", "passage"} and record["row"]["backend"] == "openai"
    assert record["model"]["identity"]["document_params"] == {"input_type": "passage"}
    assert record["row"]["model"] == "openai:minilm-test" and 0.5 < record["row"]["ndcg@10"] <= 1
    rows, _, _ = load_results(tmp_path / "remote")
    assert rows.iloc[0]["ndcg@10"] == record["row"]["ndcg@10"]


def test_a_relevance_floor_per_model(job, tmp_path, real_embedder):
    """calibrate-floor measures one on the run's own data; a model that states one uses it unless
    recall_min_dense is set."""
    from evals.embedding_cache import CachedEmbedder
    from evals.report import calibrate_floor
    from tinycontext import MemoryEngine, TinyContextConfig

    root, _ = job
    found = calibrate_floor(root / "job")
    assert 0 < found["min_dense"] < found["relevant_best_median"] <= 1 and found["queries"] == 8
    real_embedder.min_dense = 0.7
    try:
        with MemoryEngine(TinyContextConfig(memory_db_path=tmp_path / "a.db"), embedder=real_embedder) as engine:
            assert engine.default_min_dense() == 0.7
        with MemoryEngine(TinyContextConfig(memory_db_path=tmp_path / "b.db", recall_min_dense=0.3), embedder=real_embedder) as engine:
            assert engine.default_min_dense() == 0.3  # set explicitly: the setting wins
        # The harness's quality passes recall through its vector cache: the model's floor must pass through it.
        with MemoryEngine(TinyContextConfig(memory_db_path=tmp_path / "c.db"),
                          embedder=CachedEmbedder(real_embedder, tmp_path / "cache")) as engine:
            assert engine.default_min_dense() == 0.7
    finally:
        real_embedder.min_dense = None


def test_a_probe_is_reused_only_where_it_was_measured_the_same_way(tmp_path, monkeypatch):
    """Indexing rate and peak RSS are shared by a sweep's workers through a file, keyed like a job's cost
    figures: another host, package version, engine code, sample size, index setting or ``force`` probes
    again; the same request reads the figures a worker of the sweep wrote. (``probe`` itself is a stand-in
    here: a counter, since what it measures is tested above.)"""
    cfg = compose_run(tmp_path)
    base = REPO
    dataset = runner.get_dataset(cfg.dataset, base)
    models_dir = (base / Path(cfg.models_dir).expanduser()).resolve()
    model = runner.describe(cfg.embedder, models_dir, base)
    calls = []

    def counting_probe(request):
        calls.append(request)
        return {"index_docs_per_s": 100.0 + len(calls), "index_sample_docs": len(request["docs"]), "peak_rss_mb": 50.0 + len(calls)}

    monkeypatch.setattr(runner, "probe", counting_probe)
    monkeypatch.setattr(runner, "_probes", {})

    def measure(config=cfg, overrides=None, fresh=None):
        return runner._probe(config, dataset, model, models_dir, overrides or {}, tmp_path, fresh)

    first = measure()
    assert len(calls) == 1 and first["index_docs_per_s"] == 101.0
    assert measure() == first and len(calls) == 1  # the same process: from memory
    monkeypatch.setattr(runner, "_probes", {})
    assert measure() == first and len(calls) == 1  # another worker of the sweep: from the sweep's file
    assert len(list(tmp_path.glob(".probe-*.json"))) == 1
    real = runner.environment()
    changes = [
        ("host", lambda: monkeypatch.setattr(runner.socket, "gethostname", lambda: "another-host")),
        ("package", lambda: monkeypatch.setattr(
            runner, "environment", lambda: {**real, "packages": {**real["packages"], "onnxruntime": "0.0.0"}})),
        ("engine code", lambda: monkeypatch.setattr(runner, "engine_source", lambda: "edited")),
    ]
    for what, change in changes:
        before = len(calls)
        change()
        assert measure()["index_docs_per_s"] == 100.0 + before + 1, what
        monkeypatch.undo()
        monkeypatch.setattr(runner, "probe", counting_probe)
    for what, kwargs in (("index sample", {"config": compose_run(tmp_path, "latency.index_sample=9")}),
                         ("index setting", {"overrides": {"fts_tokenizer": "trigram"}}),
                         ("force", {"fresh": "launch-1"})):
        before = len(calls)
        assert measure(**kwargs)["index_docs_per_s"] == 100.0 + before + 1, what
    before = len(calls)
    assert measure(fresh="launch-1")["index_docs_per_s"] == 100.0 + before  # force probes once per launch, not per job
    runs = compose_run(tmp_path, "latency.probe_runs=3")
    before = len(calls)
    three = measure(config=runs)
    assert len(calls) == before + 3 and three["probe_runs"] == 3
    assert three["peak_rss_mb"] == float(np.median([50.0 + before + i for i in (1, 2, 3)]))
    assert (three["peak_rss_mb_min"], three["peak_rss_mb_max"]) == (50.0 + before + 1, 50.0 + before + 3)

"""One evaluation run: index a dataset through MemoryEngine.save, recall every judged query through
MemoryEngine.recall, and measure quality, cost and tokens.

A run has two passes. The quality pass may take vectors from the on-disk embedding cache and an
indexed database built once per (dataset, embedder, engine code); it computes nDCG/R/MRR, tokens and
recall within the budget for the tuning and the test split. The timing pass is live: production's
own uncached embedder, alone on the host (``evals.timing``). Indexing throughput and peak RSS come
from a fresh process per model.

Every cache key holds a fingerprint of the code that shapes its contents (see ``evals.fingerprint``),
and a finished job (same config, data, model and code) is taken from the results store instead of
being run again, unless ``force=true``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from filelock import FileLock
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from tinycontext import ConfigError, MemoryEngine, Signals, TinyContextConfig, tool_schema_tokens

from . import datasets as dataset_module
from .datasets import EvalDataset
from .embedding_cache import CachedEmbedder
from .environment import environment
from .fingerprint import engine_source, git_state, harness_source, module_source
from .metrics import per_query_quality, recall_within
from .models import EvalModel, cached_embedder, describe, live_embedder, pooling
from .records import qrels_file, run_file, seal, summarise, trec_qrels, trec_run
from .store import ResultsStore
from .timing import computing, probe, recall_latencies, timing_alone, timing_passes

log = logging.getLogger(__name__)
RANKING_DEPTH = 100
NAIVE_TOP = 10
UNLIMITED_TOKENS = 1_000_000
# Config keys that say where things are kept, not what is measured: not part of a job's key.
NOT_IN_KEY = ("hydra", "base_dir", "shared_dir", "cache_dir", "models_dir", "results_store", "force")

# Loaded datasets and probe results, kept for the next job in this process (joblib workers).
_datasets: dict[str, EvalDataset] = {}
_probes: dict[str, dict] = {}
# The last searches this process loaded (see ``searches``): {"file": path, "by_query": {qid: Signals}}.
_searches: dict = {"file": None, "by_query": {}}
SEARCH_ARGS = ("candidates", "tags", "filters")


def loader_source(params: dict) -> str:
    """The loader named by ``_target_`` and the module holding the shared text functions."""
    from hydra.utils import get_method

    loader = get_method(params["_target_"])
    return hashlib.sha256((module_source(loader) + module_source(dataset_module)).encode()).hexdigest()


def get_dataset(cfg: DictConfig, base: Path) -> EvalDataset:
    from hydra.utils import instantiate

    params = OmegaConf.to_container(cfg, resolve=True)
    if params.get("path"):
        params["path"] = str((base / Path(params["path"]).expanduser()).resolve())
    code = loader_source(params)
    key = json.dumps(params, sort_keys=True) + code
    if key not in _datasets:
        dataset = instantiate(params)
        dataset.info["loader_code"] = code
        dataset.info["params"] = params  # what rebuilds it (notebooks), with an absolute path
        _datasets[key] = dataset
    return _datasets[key]


def _overrides(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def index_key(dataset: EvalDataset, embedder: CachedEmbedder, index_overrides: dict) -> str:
    # info holds the loader's choices (e.g. LoCoMo's memory_format) that change what is saved.
    parts = {"dataset": dataset.fingerprint, "loader": dataset.info.get("loader_code"), "docs": len(dataset.docs), "info": dataset.info,
             "identity": embedder.identity, "vectors": embedder.key, "engine": engine_source(), "harness": harness_source(),
             "settings": index_overrides}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def ensure_index(dataset: EvalDataset, embedder: CachedEmbedder, cache_dir: Path, index_overrides: dict,
                 fresh: str | None = None) -> tuple[Path, dict]:
    """The indexed database for (dataset, embedder, engine code), built once; parallel jobs wait on a file lock.
    ``fresh`` (``force=true``: :func:`fresh_token`): an index not built under this token is rebuilt."""
    folder = cache_dir / "indexes"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{dataset.name}-{index_key(dataset, embedder, index_overrides)}"
    db, meta_file = folder / f"{stem}.db", folder / f"{stem}.json"
    with FileLock(str(folder / f"{stem}.lock")):
        if db.is_file() and meta_file.is_file():
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            if fresh is None or meta.get("built_for") == fresh:
                return db, {**meta, "reused": True}
        tmp = folder / f"{stem}.building.db"
        for leftover in folder.glob(f"{stem}.building.db*"):
            leftover.unlink()
        meta = {**_build_index(dataset, embedder, tmp, index_overrides), "built_for": fresh}
        # Closing the engine checkpointed the WAL, so the single file is the whole database.
        os.replace(tmp, db)
        _write_atomic(meta_file, json.dumps(meta))
    return db, {**meta, "reused": False}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def fresh_token(cfg: DictConfig, output_dir: Path, sweep_dir: Path | None) -> str | None:
    """None unless ``force``; then a token naming this launch: caches built under another token are
    rebuilt, those this launch built (another job of the same sweep) are shared."""
    if not cfg.get("force"):
        return None
    if sweep_dir is not None:
        try:  # written by the launching process at the start of every multirun (evals.callbacks)
            started = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))["started"]
            return f"{sweep_dir.resolve()}@{started}"
        except (OSError, ValueError, KeyError):
            pass
    return f"{output_dir.resolve()}@{uuid.uuid4().hex}"


def _build_index(dataset: EvalDataset, embedder: CachedEmbedder, path: Path, index_overrides: dict) -> dict:
    config = TinyContextConfig(memory_db_path=path, **index_overrides)
    # One save call per (session, batch): a conversation's chat sessions are saved one by one.
    by_session: dict[tuple[str, str], list] = {}
    for doc in dataset.docs:
        by_session.setdefault((doc.session, doc.batch), []).append(doc)
    doc_ids: dict[int, list[str]] = {}
    skipped = 0
    computed_before = embedder.computed
    started = time.perf_counter()
    # One progress bar for the whole job (the engine's own bar would restart at every save batch).
    with MemoryEngine(config, embedder=embedder) as engine, \
            tqdm(total=len(dataset.docs), desc=f"indexing {dataset.name}", unit="doc") as bar:
        for (session, _), docs in by_session.items():
            for start in range(0, len(docs), config.max_batch_size):
                batch = docs[start:start + config.max_batch_size]
                result = engine.save([{"content": d.text, "metadata": {"doc_id": d.id}, **d.fields} for d in batch], session_id=session)
                for item in result["saved"]:
                    doc_ids[item["id"]] = [batch[item["index"]].id]
                # An exact duplicate text is one memory; credit it to every document that has that text.
                for item in result["skipped"]:
                    skipped += 1
                    if "duplicate_of" in item:
                        doc_ids.setdefault(item["duplicate_of"], []).append(batch[item["index"]].id)
                bar.update(len(batch))
        seconds = time.perf_counter() - started
        session_tokens = {s["session_id"]: s["tokens"] for s in engine.sessions()}
        naive = {}
        for qid in dataset.judged:
            if dataset.naive_dump == "session":
                naive[qid] = session_tokens[dataset.query_sessions[qid]]
            else:  # BM25's top 10 in full: one fixed baseline for every config of this dataset
                session = dataset.query_sessions[qid] if dataset.query_sessions else None
                naive[qid] = engine.recall(dataset.queries[qid], session_id=session, dense_weight=0.0, top_k=NAIVE_TOP,
                                           max_tokens=UNLIMITED_TOKENS)["total_tokens"]
    return {
        "build_seconds": seconds, "docs": len(dataset.docs), "memories": len(doc_ids), "skipped": skipped,
        "embedded": embedder.computed - computed_before, "naive_tokens": naive,
        "doc_ids": {str(k): v for k, v in doc_ids.items()},
    }


def _recall_kwargs(r: DictConfig) -> dict:
    return {"dense_weight": float(r.dense_weight), "rrf_k": float(r.rrf_k), "candidates": int(r.candidates),
            **_overrides(r.get("kwargs"))}


def scored_queries(dataset: EvalDataset) -> list[str]:
    """The queries a quality pass scores: the tuning and the test split's."""
    wanted = set(dataset.split_ids(dataset.tune_split)) | set(dataset.split_ids(dataset.test_split))
    return [q for q in dataset.judged if q in wanted]


def searches(engine: MemoryEngine, dataset: EvalDataset, db: Path, engine_settings: dict, r: DictConfig,
             fresh: str | None = None) -> dict[str, Signals]:
    """Every scored query's search (``MemoryEngine.search``: its BM25 and dense candidate lists) on
    the index ``db`` with these engine settings and search arguments (candidates, tags, filters).

    Searched once per host, by the first job that needs them (the others wait on a file lock), kept
    beside the index and in this process: a sweep's configs that differ only in fusion, floor, cliff
    or budget settings fuse the same lists instead of searching again. An index never changes once
    built (its key holds the data, vectors and code), so its searches cannot go stale; ``fresh``
    (``force=true``) searches again unless this launch searched already."""
    kwargs = _recall_kwargs(r)
    wanted = {k: kwargs[k] for k in SEARCH_ARGS if k in kwargs}
    queries = [(q, dataset.queries[q], dataset.query_sessions[q] if dataset.query_sessions else None) for q in scored_queries(dataset)]
    key = hashlib.sha256(json.dumps([engine_settings, wanted, queries], sort_keys=True, default=str).encode()).hexdigest()[:20]
    file = db.with_name(f"{db.stem}.searches-{key}.json")
    if _searches["file"] != (file, fresh):
        with FileLock(str(file.with_suffix(".lock"))):
            kept = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
            if kept is not None and (fresh is None or kept.get("built_for") == fresh):
                found = {q: Signals.from_dict(s) for q, s in kept["searches"].items()}
            else:
                found = {q: engine.search(text, session_id=session, **wanted) for q, text, session in queries}
                _write_atomic(file, json.dumps({"built_for": fresh, "searches": {q: s.to_dict() for q, s in found.items()}}))
        _searches.update(file=(file, fresh), by_query=found)
    return _searches["by_query"]


def _quality_pass(engine: MemoryEngine, dataset: EvalDataset, doc_ids: dict, naive: dict, r: DictConfig, max_tokens: int,
                  rendered: bool = False, found: dict[str, Signals] | None = None) -> tuple[list[dict], dict]:
    """Per-query quality of one config and every query's ranking ({qid: [(doc id, score)]}, as deep
    as it was retrieved: the TREC run). ``found``: the queries' searches (:func:`searches`) to fuse;
    None searches afresh. Each query is ranked once: the budgeted answer and the ``depth``-deep
    ranking scored come from the same recall."""
    run: dict[str, dict[str, float]] = {}
    rankings: dict[str, list[tuple[str, float]]] = {}
    rows: list[dict] = []
    kwargs = _recall_kwargs(r)
    top_k = int(r.top_k)
    # The ranking is as deep as the configured candidate lists allow (at most 100): a shallower
    # candidates setting changes what is fused, so it changes nDCG/R, as it does in production.
    depth = min(RANKING_DEPTH, int(r.candidates))
    tune, test = set(dataset.split_ids(dataset.tune_split)), set(dataset.split_ids(dataset.test_split))
    for qid in scored_queries(dataset):
        text = dataset.queries[qid]
        session = dataset.query_sessions[qid] if dataset.query_sessions else None
        signals = found[qid] if found is not None else None
        if rendered:  # what an MCP/REST client receives: text and structured content each within the budget
            page = engine.recall_rendered(text, session_id=session, max_tokens=max_tokens, top_k=top_k, signals=signals, **kwargs)
            received, tokens = page.structured["memories"], page.tokens
            ranking = engine.recall(text, session_id=session, max_tokens=UNLIMITED_TOKENS, top_k=depth, signals=signals,
                                    **kwargs)["memories"]
        else:
            answer = engine.recall(text, session_id=session, max_tokens=max_tokens, top_k=top_k, signals=signals,
                                   ranking=depth, **kwargs)
            received, tokens, ranking = answer["memories"], answer["total_tokens"], answer["ranking"]
        n = len(ranking)
        # An exact duplicate text is one memory credited to each of its documents: they share its score.
        rankings[qid] = [(d, float(n - i)) for i, m in enumerate(ranking) for d in doc_ids[str(m["id"])]]
        run[qid] = dict(rankings[qid])
        seen = [d for m in received for d in doc_ids[str(m["id"])]]
        top = [d for m in ranking[:10] for d in doc_ids[str(m["id"])]]
        # The dense cosines of this query's relevant documents and of the best other one (calibrate-floor).
        relevant = {d for d, g in dataset.qrels[qid].items() if g > 0}
        dense = [(doc_ids[str(i)], score) for i, score in (signals.dense or ())] if signals is not None else []
        dense_relevant = [score for ids, score in dense if relevant & set(ids)]
        dense_other = next((score for ids, score in dense if not relevant & set(ids)), None)
        rows.append({"query_id": qid, "tune": qid in tune, "test": qid in test, "session": session,
                     **dataset.query_info.get(qid, {}),
                     "tokens_returned": tokens, "tokens_naive": naive[qid],
                     "memories_returned": len(received), "budget_recall": recall_within(seen, dataset.qrels[qid]),
                     "dense_relevant_max": max(dense_relevant, default=None), "dense_other_max": dense_other,
                     "retrieved": ";".join(top), "received": ";".join(seen), "relevant": ";".join(d for d, g in dataset.qrels[qid].items() if g > 0)})
    quality = per_query_quality({q["query_id"]: dataset.qrels[q["query_id"]] for q in rows}, run)
    for row in rows:
        row.update(quality[row["query_id"]])
    return rows, rankings


def _timing_pass(cfg: DictConfig, dataset: EvalDataset, db: Path, engine_settings: dict, model: EvalModel, models_dir: Path,
                 max_tokens: int) -> dict:
    """Live latencies of the test split's first ``latency.queries`` queries, after a warm-up on others,
    in ``latency.passes`` passes with the host's load sampled during each (``evals.timing``)."""
    test = dataset.split_ids(dataset.test_split)
    sample = test[: int(cfg.latency.queries)]
    others = [q for q in dataset.judged if q not in set(sample)] or sample
    warmup = others[: int(cfg.latency.warmup)]

    def pairs(ids):
        return [(dataset.queries[q], dataset.query_sessions[q] if dataset.query_sessions else None) for q in ids]

    r = cfg.retrieval
    kwargs = {"max_tokens": max_tokens, "top_k": int(r.top_k), **_recall_kwargs(r)}
    embedder = live_embedder(model, models_dir)
    lat = cfg.latency
    with MemoryEngine(TinyContextConfig(memory_db_path=db, **engine_settings), embedder=embedder) as engine:
        passes = timing_passes(lambda: recall_latencies(engine, pairs(sample), pairs(warmup), kwargs),
                               passes=int(lat.get("passes", 3)), max_competing_cores=float(lat.get("max_competing_cores", 0.5)),
                               retries=int(lat.get("retries", 2)))
    return {"queries": sample, "passes": passes, "max_competing_cores": float(lat.get("max_competing_cores", 0.5))}


def _probe(cfg: DictConfig, dataset: EvalDataset, model: EvalModel, models_dir: Path, index_overrides: dict,
           shared_dir: Path | None, fresh: str | None = None) -> dict:
    """Indexing throughput and peak RSS: the median of ``latency.probe_runs`` fresh processes, once per
    model and engine settings in this process, and once per sweep when ``shared_dir`` (the sweep
    directory) is given: the workers of a sweep share the figures instead of each probing again.
    Keyed by the host, package versions, engine code and number of runs too, and by ``fresh`` (``force=true``)."""
    n = int(cfg.latency.index_sample)
    request = {"models_dir": str(models_dir), "fields": model.engine_fields(), "pooling": cfg.embedder.get("pooling") or None,
               "engine": index_overrides,
               "docs": [{"text": d.text, "session": d.session} for d in dataset.docs[: n + 8]],
               "queries": [{"text": dataset.queries[q], "session": dataset.query_sessions[q] if dataset.query_sessions else None}
                           for q in dataset.judged[:5] if not dataset.query_sessions
                           or dataset.query_sessions[q] in {d.session for d in dataset.docs[: n + 8]}]}
    runs = max(1, int(cfg.latency.probe_runs))
    where = {"host": socket.gethostname(), "packages": environment()["packages"], "engine": engine_source(), "fresh": fresh,
             "probe_runs": runs}
    key = hashlib.sha256(json.dumps([request, where], sort_keys=True).encode()).hexdigest()
    if key in _probes:
        return _probes[key]
    file = shared_dir / f".probe-{key[:20]}.json" if shared_dir is not None else None
    if file is not None and file.is_file():  # written by another worker of this sweep (under the timing lock)
        _probes[key] = json.loads(file.read_text(encoding="utf-8"))
        return _probes[key]
    runs = [probe(request) for _ in range(runs)]
    rss = [r["peak_rss_mb"] for r in runs]
    result = {"index_docs_per_s": float(np.median([r["index_docs_per_s"] for r in runs])),
              "index_sample_docs": runs[0]["index_sample_docs"], "peak_rss_mb": float(np.median(rss)),
              "peak_rss_mb_min": min(rss), "peak_rss_mb_max": max(rss), "probe_runs": len(runs)}
    if file is not None:
        _write_atomic(file, json.dumps(result))
    _probes[key] = result
    return result


def is_default(cfg: DictConfig, engine_settings: dict) -> bool:
    """Whether this config is what ships: the engine's own defaults, built-in model, no overrides."""
    d = TinyContextConfig()
    r = cfg.retrieval
    return (float(r.dense_weight) == d.recall_dense_weight and float(r.rrf_k) == d.recall_rrf_k
            and int(r.top_k) == d.recall_top_k and int(r.candidates) == d.recall_candidates
            and int(cfg.budget.max_tokens) == d.recall_max_tokens and not _overrides(r.get("kwargs"))
            and str(cfg.embedder.model) == d.embedding_model and not cfg.embedder.pooling
            and not cfg.embedder.query_prefix and not cfg.embedder.document_prefix
            and all(getattr(d, k) == v for k, v in engine_settings.items()))


def job_key(cfg: DictConfig, dataset: EvalDataset, vectors: str, stated: dict | None = None) -> str:
    """What a result depends on: the config (not where files live) with its latency settings, the data
    and its loader code, the vectors (model file, pooling, vector recipe, onnxruntime; a server's
    model and probe vectors), what the model states that recall reads (``EvalModel.stated``), the engine
    and harness source, and where cost was measured: the host and the package versions (a reused job's
    latency, RSS and rates were measured under the same)."""
    config = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in NOT_IN_KEY}
    config["dataset"] = {k: v for k, v in config["dataset"].items() if k not in ("path", "cache_dir")}
    config["embedder"] = {k: v for k, v in config["embedder"].items() if k not in ("model", "url")}
    parts = {"config": config, "dataset": [dataset.fingerprint, dataset.info.get("loader_code")], "vectors": vectors,
             "stated": stated or {}, "engine": engine_source(), "harness": harness_source(), "host": socket.gethostname(),
             "packages": environment()["packages"]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _flat(prefix: str, values: dict) -> dict:
    return {f"{prefix}.{k}": v for k, v in values.items()}


def write_outputs(output_dir: Path, record: dict, per_query: pd.DataFrame, files: dict[str, bytes]) -> None:
    """result.json, per_query.csv and the TREC run and qrels files of a job, each written atomically (a
    shared sweep dir never shows half a file); ``files`` holds per_query.csv's bytes as hashed."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, data in [*files.items(), ("result.json", json.dumps(record, indent=2, default=str).encode())]:
        tmp = output_dir / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, output_dir / name)


def _store_path(cfg: DictConfig, base: Path) -> Path:
    return (base / Path(cfg.results_store).expanduser()).resolve()


def check_splits(cfg: DictConfig, dataset: EvalDataset) -> bool:
    """True when configs are tuned on the split they are reported on (allowed only with
    ``allow_test_tuning=true``, and then labelled on every output)."""
    same = dataset.tune_split == dataset.test_split and dataset.cross_validate is None
    if same and not cfg.get("allow_test_tuning"):
        raise ConfigError(
            f"dataset.tune_split={dataset.tune_split} is also the test split: a config chosen on it would be reported "
            "on the queries it was chosen on. Tune on another split (SciFact: train), or pass allow_test_tuning=true "
            "to do it anyway (every output is then labelled tuned-on-test).", split=dataset.tune_split)
    return same


def reuse_finished(cfg: DictConfig, output_dir: Path, overrides: list[str] = ()) -> dict | None:
    """If this job (same config, data, model, code, host and packages) finished before and ``force`` is
    off, write its files from the results store into ``output_dir`` and return its record. A stored
    job whose content hash fails is refused (``TamperedError``)."""
    if cfg.get("force"):
        return None
    base = Path(cfg.base_dir).expanduser().resolve()
    dataset = get_dataset(cfg.dataset, base)
    check_splits(cfg, dataset)
    model = describe(cfg.embedder, (base / Path(cfg.models_dir).expanduser()).resolve(), base)
    key = job_key(cfg, dataset, model.vectors, model.stated)
    with ResultsStore(_store_path(cfg, base)) as store:
        hit = store.find(key)
    if hit is None:
        return None
    record, per_query, files = hit
    record["reused_run"] = {"run_id": record["run_id"], "finished_at": record["finished_at"]}
    record["row"]["overrides"] = " ".join(overrides)
    write_outputs(output_dir, record, per_query, files)
    log.info("job %s already finished (run %s, %s): reused; force=true runs it again", key, record["run_id"],
             record["finished_at"])
    return record


def run_config(cfg: DictConfig, output_dir: Path, overrides: list[str] = (), sweep_dir: Path | None = None) -> dict:
    """Evaluate one composed config; write result.json, per_query.csv and the TREC run and qrels files
    into ``output_dir`` (``sweep_dir``: the sweep it belongs to, whose jobs share one probe per model)."""
    started = time.perf_counter()
    if (record := reuse_finished(cfg, output_dir, overrides)) is not None:
        return record
    base = Path(cfg.base_dir).expanduser().resolve()
    cache_dir = (base / Path(cfg.cache_dir).expanduser()).resolve()
    models_dir = (base / Path(cfg.models_dir).expanduser()).resolve()
    store_path = _store_path(cfg, base)
    index_overrides, recall_overrides = _overrides(cfg.engine.index), _overrides(cfg.engine.recall)
    engine_settings = {**index_overrides, **recall_overrides}
    dataset = get_dataset(cfg.dataset, base)
    tuned_on_test = check_splits(cfg, dataset)
    model = describe(cfg.embedder, models_dir, base)
    key = job_key(cfg, dataset, model.vectors, model.stated)
    fresh = fresh_token(cfg, output_dir, sweep_dir)

    r, max_tokens = cfg.retrieval, int(cfg.budget.max_tokens)
    # Where a job's time goes (seconds per phase), so sweep overheads can be found in results.csv.
    phases, mark = {}, time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[f"seconds_{name}"] = now - mark
        mark = now

    phase("setup")
    with computing(cache_dir):
        embedder = cached_embedder(model, cache_dir, models_dir)
        embedder.refresh = fresh  # force=true: vectors are computed again, once per launch
        computed, hits = embedder.computed, embedder.hits  # the embedder outlives jobs: count this one's only
        db, index = ensure_index(dataset, embedder, cache_dir, index_overrides, fresh)
        phase("index")
        with MemoryEngine(TinyContextConfig(memory_db_path=db, **engine_settings), embedder=embedder) as engine:
            found = searches(engine, dataset, db, engine_settings, r, fresh)
            phase("search")
            rows, rankings = _quality_pass(engine, dataset, index["doc_ids"], index["naive_tokens"], r, max_tokens,
                                           bool(cfg.budget.get("rendered", False)), found)
        phase("quality")
    with timing_alone(cache_dir):
        phase("wait_alone")
        latency = _timing_pass(cfg, dataset, db, engine_settings, model, models_dir, max_tokens)
        phase("timing")
        cost = _probe(cfg, dataset, model, models_dir, index_overrides, sweep_dir, fresh)
        phase("probe")

    per_query = pd.DataFrame(rows)
    first_pass = dict(zip(latency["queries"], latency["passes"][0]["ms"])) if latency["passes"] else {}
    per_query.insert(3, "latency_ms", per_query["query_id"].map(first_pass))
    inner = embedder.inner
    row = {
        "dataset": dataset.name, "embedder": cfg.embedder.name, "backend": model.backend, "model": model.facts["model"],
        "pooling": pooling(inner), "model_pooling": model.facts["model_pooling"], "query_prefix": inner.query_prefix,
        "document_prefix": inner.document_prefix,
        "dense_weight": float(r.dense_weight), "rrf_k": float(r.rrf_k), "top_k": int(r.top_k), "candidates": int(r.candidates),
        "max_tokens": max_tokens, **_flat("engine", engine_settings), **_flat("recall", _overrides(r.get("kwargs"))),
        "is_default": is_default(cfg, engine_settings), "tuned_on_test": tuned_on_test,
        "tune_split": dataset.tune_split, "test_split": dataset.test_split, "cross_validate": dataset.cross_validate,
        **summarise(per_query, latency, tool_schema_tokens(TinyContextConfig(memory_db_path=db, **engine_settings))),
        **cost, "model_mb": model.facts["model_mb"],
        "index_build_seconds": index["build_seconds"], "index_reused": index["reused"], "index_embedded": index["embedded"],
        "docs": index["docs"], "memories": index["memories"],
        "embedding_model": model.spec, "overrides": " ".join(overrides),
    }
    row["run_seconds"] = time.perf_counter() - started
    row.update(phases)
    env = environment()
    splits = list(dict.fromkeys([dataset.tune_split, dataset.test_split]))
    files = {"per_query.csv": per_query.to_csv(index=False).encode()}
    for split in splits:
        qids = dataset.split_ids(split)
        files[run_file(split)] = trec_run(rankings, qids).encode()
        files[qrels_file(split)] = trec_qrels(dataset.qrels, qids).encode()
    record = {
        "run_id": uuid.uuid4().hex, "job_key": key, "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "row": row,
        "latency": latency,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "dataset": {"name": dataset.name, "fingerprint": dataset.fingerprint, **dataset.info,
                    "tune_split": dataset.tune_split, "test_split": dataset.test_split, "cross_validate": dataset.cross_validate},
        "model": {"identity": embedder.identity, **model.facts, "vector_key": embedder.key,
                  "engine_fields": model.engine_fields()},
        "embedding_cache": {"computed": embedder.computed - computed, "hits": embedder.hits - hits},
        "fresh": fresh,
        "manifest": {"git": git_state(), "code": {"engine": engine_source(), "harness": harness_source()},
                     "host": socket.gethostname(), **env},
    }
    seal(record, files)
    write_outputs(output_dir, record, per_query, files)
    with ResultsStore(store_path) as store:
        store.append(record, files)
    return record

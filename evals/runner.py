"""One evaluation run: index a dataset through MemoryEngine.save, recall every judged query through
MemoryEngine.recall, and measure quality, cost and tokens.

Sweeps stay cheap because nothing that a config does not change is recomputed: document and query
vectors come from the on-disk embedding cache, and the indexed database for a (dataset, embedder
identity) pair is built once under a file lock and reused by every recall-only config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import pandas as pd
from filelock import FileLock
from omegaconf import DictConfig, OmegaConf

import tinycontext
from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.embeddings import Embedder
from tinycontext.model_hub import resolve_model
from tinycontext.store import SCHEMA_VERSION

from .datasets import EvalDataset
from .embedding_cache import CachedEmbedder
from .environment import PeakRSS, environment
from .metrics import (
    MEASURES,
    latency_summary,
    mean_quality,
    per_query_quality,
    recall_within,
    token_summary,
)

log = logging.getLogger(__name__)
RANKING_DEPTH = 100
UNLIMITED_TOKENS = 1_000_000

# Loaded models and datasets, kept for the next job in this process (basic launcher, joblib workers).
_embedders: dict[tuple, CachedEmbedder] = {}
_datasets: dict[str, EvalDataset] = {}


def resolve_model_spec(spec: str, base: Path) -> str:
    """A path-like model spec becomes absolute (against ``base``); tiers, registry names, hub ids stay."""
    if spec.startswith((".", "/", "~")) or (base / spec).is_dir():
        return str((base / Path(spec).expanduser()).resolve())
    return spec


def get_embedder(cfg: DictConfig, models_dir: Path, cache_dir: Path, base: Path) -> CachedEmbedder:
    spec = resolve_model_spec(str(cfg.model), base)
    key = (spec, cfg.pooling, cfg.query_prefix, cfg.document_prefix, int(cfg.batch_size), str(cache_dir))
    if key not in _embedders:
        bundle = resolve_model(spec, models_dir)
        inner = Embedder(bundle, batch_size=int(cfg.batch_size), cache_size=0, pooling=cfg.pooling or None,
                         query_prefix=cfg.query_prefix or "", document_prefix=cfg.document_prefix or "")
        inner.embed(["warm up"], "query")  # the first inference is slow; keep it out of query latencies
        _embedders[key] = CachedEmbedder(inner, cache_dir)
    return _embedders[key]


def get_dataset(cfg: DictConfig, base: Path) -> EvalDataset:
    from hydra.utils import instantiate

    params = OmegaConf.to_container(cfg, resolve=True)
    if params.get("path"):
        params["path"] = str((base / Path(params["path"]).expanduser()).resolve())
    key = json.dumps(params, sort_keys=True)
    if key not in _datasets:
        _datasets[key] = instantiate(params)
    return _datasets[key]


def index_key(dataset: EvalDataset, embedder: CachedEmbedder) -> str:
    parts = {"dataset": dataset.fingerprint, "docs": len(dataset.docs), "identity": embedder.identity,
             "vectors": embedder.key, "tinycontext": tinycontext.__version__, "schema": SCHEMA_VERSION}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def ensure_index(dataset: EvalDataset, embedder: CachedEmbedder, cache_dir: Path) -> tuple[Path, dict]:
    """The indexed database for (dataset, embedder), built once; parallel jobs wait on a file lock."""
    folder = cache_dir / "indexes"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{dataset.name}-{index_key(dataset, embedder)}"
    db, meta_file = folder / f"{stem}.db", folder / f"{stem}.json"
    with FileLock(str(folder / f"{stem}.lock")):
        if db.is_file() and meta_file.is_file():
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            return db, {**meta, "reused": True}
        tmp = folder / f"{stem}.building.db"
        for leftover in folder.glob(f"{stem}.building.db*"):
            leftover.unlink()
        meta = _build_index(dataset, embedder, tmp)
        # Closing the engine checkpointed the WAL, so the single file is the whole database.
        os.replace(tmp, db)
        meta_file.write_text(json.dumps(meta), encoding="utf-8")
    return db, {**meta, "reused": False}


def _build_index(dataset: EvalDataset, embedder: CachedEmbedder, path: Path) -> dict:
    config = TinyContextConfig(memory_db_path=path)
    by_session: dict[str, list] = {}
    for doc in dataset.docs:
        by_session.setdefault(doc.session, []).append(doc)
    doc_ids: dict[int, list[str]] = {}
    skipped = 0
    computed_before = embedder.computed
    log.info("indexing %d documents of %s with %s", len(dataset.docs), dataset.name, embedder.identity["model"])
    started = time.perf_counter()
    with MemoryEngine(config, embedder=embedder, progress=True) as engine:
        for session, docs in by_session.items():
            for start in range(0, len(docs), config.max_batch_size):
                batch = docs[start:start + config.max_batch_size]
                result = engine.save([{"content": d.text, "metadata": {"doc_id": d.id}} for d in batch], session_id=session)
                for item in result["saved"]:
                    doc_ids[item["id"]] = [batch[item["index"]].id]
                # An exact duplicate text is one memory; credit it to every document that has that text.
                for item in result["skipped"]:
                    skipped += 1
                    if "duplicate_of" in item:
                        doc_ids.setdefault(item["duplicate_of"], []).append(batch[item["index"]].id)
        session_tokens = {s["session_id"]: s["tokens"] for s in engine.sessions()}
    seconds = time.perf_counter() - started
    return {
        "index_seconds": seconds, "docs": len(dataset.docs), "memories": len(doc_ids), "skipped": skipped,
        "embedded": embedder.computed - computed_before, "session_tokens": session_tokens,
        "doc_ids": {str(k): v for k, v in doc_ids.items()},
    }


def _recall_all(engine: MemoryEngine, dataset: EvalDataset, embedder: CachedEmbedder, doc_ids: dict, session_tokens: dict,
                r: DictConfig, max_tokens: int) -> list[dict]:
    run: dict[str, dict[str, float]] = {}
    rows: list[dict] = []
    kwargs = {"dense_weight": float(r.dense_weight), "rrf_k": float(r.rrf_k), "candidates": int(r.candidates)}
    for qid in dataset.judged:
        text = dataset.queries[qid]
        session = dataset.query_sessions[qid] if dataset.query_sessions else None
        # What the agent gets: the configured top_k within the budget. Timed, query embedding included.
        embedder.take_replayed_ms()
        started = time.perf_counter()
        answer = engine.recall(text, session_id=session, max_tokens=max_tokens, top_k=int(r.top_k), **kwargs)
        latency = (time.perf_counter() - started) * 1000 + embedder.take_replayed_ms()
        # The full top-100 ranking, for nDCG/R/MRR and the naive "paste the top 100" dump.
        ranking = engine.recall(text, session_id=session, max_tokens=UNLIMITED_TOKENS, top_k=RANKING_DEPTH, **kwargs)
        n = len(ranking["memories"])
        run[qid] = {d: float(n - i) for i, m in enumerate(ranking["memories"]) for d in doc_ids[str(m["id"])]}
        seen = [d for m in answer["memories"] for d in doc_ids[str(m["id"])]]
        naive = session_tokens[session] if dataset.naive_dump == "session" else ranking["total_tokens"]
        rows.append({"query_id": qid, "latency_ms": latency, "tokens_returned": answer["total_tokens"],
                     "tokens_naive": naive, "memories_returned": len(answer["memories"]),
                     "budget_recall": recall_within(seen, dataset.qrels[qid])})
    quality = per_query_quality({q: dataset.qrels[q] for q in dataset.judged}, run)
    for row in rows:
        row.update(quality[row["query_id"]])
    return rows


def run_config(cfg: DictConfig, output_dir: Path, overrides: list[str] = ()) -> dict:
    """Evaluate one composed config; write result.json and per_query.csv into ``output_dir``."""
    started = time.perf_counter()
    base = Path(cfg.base_dir).expanduser().resolve()
    cache_dir = (base / Path(cfg.cache_dir).expanduser()).resolve()
    models_dir = (base / Path(cfg.models_dir).expanduser()).resolve()
    with PeakRSS() as rss:
        dataset = get_dataset(cfg.dataset, base)
        embedder = get_embedder(cfg.embedder, models_dir, cache_dir, base)
        db, index = ensure_index(dataset, embedder, cache_dir)
        r, max_tokens = cfg.retrieval, int(cfg.budget.max_tokens)
        with MemoryEngine(TinyContextConfig(memory_db_path=db), embedder=embedder) as engine:
            rows = _recall_all(engine, dataset, embedder, index["doc_ids"], index["session_tokens"], r, max_tokens)
    per_query = pd.DataFrame(rows, columns=["query_id", "latency_ms", "tokens_returned", "tokens_naive", "memories_returned",
                                            "budget_recall", *MEASURES])
    bundle = embedder.bundle
    row = {
        "dataset": dataset.name, "embedder": cfg.embedder.name, "model": bundle.name, "pooling": embedder.inner.pooling,
        "model_pooling": bundle.pooling, "query_prefix": embedder.inner.query_prefix,
        "document_prefix": embedder.inner.document_prefix, "dense_weight": float(r.dense_weight), "rrf_k": float(r.rrf_k),
        "top_k": int(r.top_k), "candidates": int(r.candidates), "max_tokens": max_tokens,
        **mean_quality({q["query_id"]: q for q in rows}),
        "budget_recall": float(per_query["budget_recall"].mean()) if rows else 0.0,
        **token_summary(per_query["tokens_returned"].tolist(), per_query["tokens_naive"].tolist()),
        "index_seconds": index["index_seconds"], "index_docs_per_s": index["docs"] / max(index["index_seconds"], 1e-9),
        "index_reused": index["reused"], "index_embedded": index["embedded"],
        **latency_summary(per_query["latency_ms"].tolist()),
        "peak_rss_mb": rss.peak_mb, "model_mb": bundle.model_file.stat().st_size / 2**20,
        "queries": len(rows), "docs": index["docs"], "memories": index["memories"],
        "embedding_model": resolve_model_spec(str(cfg.embedder.model), base),
        "overrides": " ".join(overrides),
    }
    row["run_seconds"] = time.perf_counter() - started
    record = {
        "row": row,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "dataset": {"name": dataset.name, "fingerprint": dataset.fingerprint, **dataset.info},
        "model": {"identity": embedder.identity, "sha256": bundle.sha256, "path": str(bundle.path), "vector_key": embedder.key},
        "embedding_cache": {"computed": embedder.computed, "hits": embedder.hits},
        "environment": environment(),
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "result.json").write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    per_query.to_csv(output_dir / "per_query.csv", index=False)
    return record

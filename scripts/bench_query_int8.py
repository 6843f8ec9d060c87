"""Queries on the int8-compute graph (embedding_int8_queries, the default) vs the float32 graph of the
built-in model: query embedding time, vector agreement, and retrieval quality on the tuning splits only.

Speed: fresh LoCoMo/SciFact questions, ``embed_query`` on two uncached embedders, interleaved, thread
CPU and wall per query. Vectors: cosine of the two query vectors; an int8 query vector alone vs in a
batch. Quality, same stored vectors for both (documents are always embedded by the float32 graph):
LoCoMo dev (5 conversations saved as turns, one save per chat session, default recall) R@10 / R@5,
and SciFact train (809 queries) nDCG@10 with defaults, each as a paired difference with a bootstrap CI.
Recall: on a bench_scale.py database (``--scale-workdir``), ``recall`` with defaults and fresh questions,
an engine with int8 queries and one without in the same process, alternating in blocks of 10 queries:
wall and process CPU p50/p95.

    python scripts/bench_query_int8.py --workdir /tmp/q8 --json notes/bench_engine_runs/query_int8.json
    python scripts/bench_query_int8.py --workdir /tmp/q8 --scifact-index <harness index .db>  # reuse a SciFact index
    python scripts/bench_query_int8.py --workdir /tmp/q8 --only recall --scale-workdir /tmp/w10k  # bench_scale.py's 10k
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import ir_measures
import numpy as np
from ir_measures import R, nDCG

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine  # noqa: E402
import bench_locomo  # noqa: E402
from evals.stats import bootstrap_ci  # noqa: E402
from tinycontext import Embedder, MemoryEngine, TinyContextConfig  # noqa: E402
from tinycontext.models.hub import builtin_bundle  # noqa: E402


def embedder(int8: bool) -> Embedder:
    return Embedder(builtin_bundle(), cache_size=0, int8_queries=int8)


def questions(n: int, seed: int) -> list[str]:
    texts = [q["question"] for c in bench_locomo.load() for q in c["qa"]]
    texts += [json.loads(line)["text"] for line in open(bench_engine.SCIFACT / "queries.jsonl", encoding="utf-8")]
    return random.Random(seed).sample(sorted(set(texts)), n)


def speed(texts: list[str]) -> dict:
    exact, int8 = embedder(False), embedder(True)
    for text in texts[:5]:
        exact.embed_query(text), int8.embed_query(text)
    times = {"float32": ([], []), "int8": ([], [])}
    vectors = {"float32": [], "int8": []}
    for text in texts:
        for name, model in (("float32", exact), ("int8", int8)):
            wall, cpu = time.perf_counter(), time.thread_time()
            vectors[name].append(model.embed_query(text))
            times[name][1].append(time.thread_time() - cpu)
            times[name][0].append(time.perf_counter() - wall)
    cos = (np.array(vectors["float32"]) * np.array(vectors["int8"])).sum(axis=1)
    batch = texts[:32]
    together = int8.embed(batch, "query")
    alone = np.stack([int8.embed_query(t) for t in batch])
    out = {name: {"wall_p50_ms": 1e3 * statistics.median(w), "wall_p95_ms": 1e3 * float(np.percentile(w, 95)),
                  "thread_cpu_p50_ms": 1e3 * statistics.median(c)} for name, (w, c) in times.items()}
    out |= {"queries": len(texts), "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
            "batch_vs_alone_max_abs": float(np.abs(together - alone).max()), "query_recipe": int8.recipe("query")}
    return out


def per_query(qrels: list, run: list, measure) -> dict[str, float]:
    q = [ir_measures.Qrel(str(a), str(b), int(c)) for a, b, c in qrels]
    r = [ir_measures.ScoredDoc(str(a), str(b), -float(c)) for a, b, c in run]
    return {m.query_id: m.value for m in ir_measures.iter_calc([measure], q, r)}


def paired(qrels: list, runs: dict[str, list], measure, queries: list[str]) -> dict:
    values = {name: per_query(qrels, run, measure) for name, run in runs.items()}
    a = np.array([values["float32"].get(q, 0.0) for q in queries])
    b = np.array([values["int8"].get(q, 0.0) for q in queries])
    lo, hi = bootstrap_ci(b - a)
    return {"float32": float(a.mean()), "int8": float(b.mean()), "diff": float((b - a).mean()), "diff_ci95": [lo, hi],
            "queries_changed": int((a != b).sum()), "queries": len(queries)}


def locomo(work: Path) -> dict:
    qrels, runs = [], {"float32": [], "int8": []}
    qids = []
    for conv in bench_locomo.load():
        db = work / f"locomo-{conv['sample_id']}.db"
        for old in work.glob(db.name + "*"):
            old.unlink()
        cfg = TinyContextConfig(memory_db_path=db, models_dir=work / "models")
        with MemoryEngine(cfg, embedder=embedder(False)) as engine:
            dia_to_id, _, _ = bench_engine.ingest_locomo(engine, conv, "turns")
        qrels += bench_locomo.qrels_for(conv, dia_to_id)
        qids += [q["qid"] for q in bench_locomo.questions(conv)]
        for name in runs:
            with MemoryEngine(cfg, embedder=embedder(name == "int8")) as engine:
                runs[name] += bench_engine.recall_run(engine, conv)[0]
    return {"R@10": paired(qrels, runs, R @ 10, qids), "R@5": paired(qrels, runs, R @ 5, qids)}


def scifact(work: Path, index: Path | None) -> dict:
    if index is not None:  # a harness index: session "corpus", memory id -> [doc ids] beside it
        db, session = index, "corpus"
        id_to_doc = {k: v[0] for k, v in json.loads(index.with_suffix(".json").read_text())["doc_ids"].items()}
    else:
        (db, id_to_doc, _), session = bench_engine.scifact_db(work, reuse=True), "scifact"
    _, queries, qrels = bench_engine.load_scifact("train")
    runs = {}
    for name in ("float32", "int8"):
        cfg = TinyContextConfig(memory_db_path=db, models_dir=work / "models")
        with MemoryEngine(cfg, embedder=embedder(name == "int8")) as engine:
            runs[name] = [(qid, id_to_doc[str(m["id"])], m["rank"]) for qid, text in queries.items()
                          for m in engine.recall(text, session_id=session, top_k=10, max_tokens=bench_engine.UNLIMITED)["memories"]]
    return {"nDCG@10": paired(qrels, runs, nDCG @ 10, list(queries))}


def recall(scale_work: Path, n: int) -> dict:
    import bench_scale

    texts = questions(n + 10, seed=52)
    engines = {name: MemoryEngine(bench_scale.config(scale_work, embedding_int8_queries=name == "int8")) for name in ("float32", "int8")}
    times = {name: ([], []) for name in engines}
    try:
        for name, engine in engines.items():
            for text in texts[:5]:  # load the model and the session's vectors
                engine.recall(text, session_id=bench_scale.SESSION)
        for start in range(10, n + 10, 10):
            for name, engine in engines.items():
                for text in texts[start:start + 10]:
                    wall, cpu = time.perf_counter(), time.process_time()
                    engine.recall(text, session_id=bench_scale.SESSION)
                    times[name][1].append(time.process_time() - cpu)
                    times[name][0].append(time.perf_counter() - wall)
    finally:
        for engine in engines.values():
            engine.close()
    return {name: {"wall_p50_ms": 1e3 * statistics.median(w), "wall_p95_ms": 1e3 * float(np.percentile(w, 95)),
                   "cpu_p50_ms": 1e3 * statistics.median(c), "cpu_p95_ms": 1e3 * float(np.percentile(c, 95)), "queries": len(w)}
            for name, (w, c) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=300, help="fresh questions for the speed part")
    parser.add_argument("--scifact-index", type=Path, help="an existing SciFact index (the harness's), instead of building one")
    parser.add_argument("--scale-workdir", type=Path, help="a bench_scale.py --workdir, for the recall part")
    parser.add_argument("--recalls", type=int, default=200, help="fresh questions per engine in the recall part")
    parser.add_argument("--only", default="speed,locomo,scifact", help="comma list of speed, locomo, scifact, recall")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    parts = args.only.split(",")
    out = {"load_start": os.getloadavg()[0]}
    if "speed" in parts:
        out["speed"] = speed(questions(args.queries, seed=25))
    if "locomo" in parts:
        out["locomo_dev"] = locomo(args.workdir)
    if "scifact" in parts:
        out["scifact_train"] = scifact(args.workdir, args.scifact_index)
    if "recall" in parts:
        out["recall"] = recall(args.scale_workdir, args.recalls)
    out["load_end"] = os.getloadavg()[0]
    report(out, args.json)


def report(out: dict, path: Path | None) -> None:
    """The figures as JSON on stdout, and into ``path`` when given."""
    text = json.dumps(out, indent=1)
    print(text)
    if path:
        path.write_text(text + "\n")


if __name__ == "__main__":
    main()

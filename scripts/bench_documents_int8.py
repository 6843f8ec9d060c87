"""Documents on an int8-compute graph (``--graph outlier``: the default, embedding_outlier_documents;
``--graph int8``: embedding_int8_documents) vs the float32 graph, int8 queries in both: retrieval quality
paired per question.

LoCoMo dev: each of the 5 conversations saved as turns (one save per chat session, default settings) into
two fresh databases, one per document graph; recall with defaults, R@10 / R@5. SciFact (``--split``
train: 809 queries, the tuning split; test: 300): the corpus saved into two fresh databases, recall with
defaults, nDCG@10. Each as the per-question difference candidate - float32 with a bootstrap 95 % CI
(scripts/bench_query_int8.py's ``paired``), plus the cosine of the two graphs' vectors for every stored
text. LoCoMo has no test split here, and the outlier graph's calibration read its dev turns (channel
choice only: scripts/calibrate_int8_outliers.py).

    python scripts/bench_documents_int8.py --workdir /tmp/d8 --json notes/bench_engine_runs/documents_int8_quality.json
    python scripts/bench_documents_int8.py --workdir /tmp/d8 --graph outlier --split test --only scifact
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from ir_measures import R, nDCG

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine  # noqa: E402
import bench_locomo  # noqa: E402
from bench_query_int8 import paired, report  # noqa: E402
from tinycontext import Embedder, MemoryEngine, TinyContextConfig  # noqa: E402
from tinycontext.models.hub import builtin_bundle  # noqa: E402

GRAPHS = ("float32", "int8")  # the baseline, the candidate (--graph)
CANDIDATES = {"outlier": {}, "int8": {"int8_documents": True}}


def engine(db: Path, graph: str, candidate: str) -> MemoryEngine:
    for old in db.parent.glob(db.name + "*"):
        old.unlink()
    cfg = TinyContextConfig(memory_db_path=db, models_dir=db.parent / "models")
    options = CANDIDATES[candidate] if graph == "int8" else {"outlier_documents": False}
    return MemoryEngine(cfg, embedder=Embedder(builtin_bundle(), cache_size=0, **options))


def stored(engine: MemoryEngine) -> np.ndarray:
    rows = engine.store.read("SELECT memory_id, embedding FROM memory_vectors ORDER BY memory_id")
    return np.stack([np.frombuffer(blob, np.float32) for _, blob in rows])


def cosines(vectors: dict[str, list[np.ndarray]]) -> dict:
    a, b = np.concatenate(vectors["float32"]), np.concatenate(vectors["int8"])
    cos = (a * b).sum(axis=1)
    return {"vectors": len(cos), "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}


def locomo(work: Path, candidate: str) -> dict:
    qrels, qids, runs, vectors = [], [], {g: [] for g in GRAPHS}, {g: [] for g in GRAPHS}
    for conv in bench_locomo.load():
        mappings = []
        for graph in GRAPHS:
            with engine(work / f"locomo-{conv['sample_id']}-{graph}.db", graph, candidate) as e:
                dia_to_id, _, _ = bench_engine.ingest_locomo(e, conv, "turns")
                assert ("document_graph" in e.embedder.identity) == (graph == "int8")
                runs[graph] += bench_engine.recall_run(e, conv)[0]
                vectors[graph].append(stored(e))
            mappings.append(dia_to_id)
        assert mappings[0] == mappings[1], "both databases must number the turns alike"
        qrels += bench_locomo.qrels_for(conv, mappings[0])
        qids += [q["qid"] for q in bench_locomo.questions(conv)]
    return {"R@10": paired(qrels, runs, R @ 10, qids), "R@5": paired(qrels, runs, R @ 5, qids), "vectors": cosines(vectors)}


def scifact(work: Path, candidate: str, split: str) -> dict:
    corpus, queries, qrels = bench_engine.load_scifact(split)
    runs, vectors = {}, {}
    for graph in GRAPHS:
        with engine(work / f"scifact-{graph}.db", graph, candidate) as e:
            id_to_doc, rate = bench_engine.index_scifact(e, corpus)
            runs[graph] = [(qid, id_to_doc[str(m["id"])], m["rank"]) for qid, text in queries.items()
                           for m in e.recall(text, session_id="scifact", top_k=10, max_tokens=bench_engine.UNLIMITED)["memories"]]
            vectors[graph] = [stored(e)]
            print(f"scifact {graph}: indexed {len(id_to_doc)} docs at {rate:.1f}/s", file=sys.stderr)
    return {"nDCG@10": paired(qrels, runs, nDCG @ 10, list(queries)), "vectors": cosines(vectors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--only", default="locomo,scifact", help="comma list of locomo, scifact")
    parser.add_argument("--graph", choices=list(CANDIDATES), default="outlier", help="the candidate document graph")
    parser.add_argument("--split", choices=("train", "test"), default="train", help="SciFact's queries")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    parts = args.only.split(",")
    out = {"graph": args.graph, "load_start": os.getloadavg()}
    if "locomo" in parts:
        out["locomo_dev"] = locomo(args.workdir, args.graph)
    if "scifact" in parts:
        out[f"scifact_{args.split}"] = scifact(args.workdir, args.graph, args.split)
    out["load_end"] = os.getloadavg()
    report(out, args.json)


if __name__ == "__main__":
    main()

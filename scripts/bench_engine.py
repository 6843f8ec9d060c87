"""Benchmark the real engine (MemoryEngine.save / .recall) with the `fast` model (minilm-l6-tuned since session 18;
the baseline below runs 0.5.1 on the int8 weights minilm-l6-tuned is made from).

  locomo    LoCoMo dev: ingest memories/s, R@5, R@10, nDCG@10, MRR@10 of evidence turns, tokens returned
  latency   recall p50/p95 at 1k / 10k / 100k memories in one session (fresh and repeated queries)
  scifact   SciFact test nDCG@10: default hybrid, BM25 only (dense_weight 0), dense only (1)
  baseline  TinyContext 0.5.1 on LoCoMo in its own venv (scripts/bench_baseline_tinycontext05.py)

    python scripts/bench_engine.py                       # everything (~15 min on 2 busy cores)
    python scripts/bench_engine.py --only locomo,latency --quick --json /tmp/b.json

Metrics come from ir-measures (qrels from evidence / BEIR qrels, run from recall ranks).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ir_measures
import numpy as np
from ir_measures import MRR, Qrel, R, ScoredDoc, nDCG

import bench_locomo
from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.models.embedder import Embedder
from tinycontext.memory.engine import _content_hash
from tinycontext.models.hub import resolve_model
from tinycontext.memory.store import now_iso

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SCIFACT = SHARED / "datasets" / "scifact"
BASELINE_PY = Path("/work/bench-venv-0.5.1/bin/python")
LOCOMO_MEASURES = [R @ 5, R @ 10, nDCG @ 10, MRR @ 10]
UNLIMITED = 1_000_000  # token budget that never truncates, for ranking metrics


def new_engine(db: Path, **config) -> MemoryEngine:
    """A fresh engine (fresh embedder, so no LRU cache carries over between timed runs); ``fast`` unless
    ``embedding_model`` is given."""
    cfg = TinyContextConfig(memory_db_path=db, models_dir=db.parent / "models", **{"embedding_model": "fast", **config})
    bundle = resolve_model(cfg.embedding_model, cfg.models_dir)
    return MemoryEngine(cfg, embedder=Embedder(bundle, batch_size=cfg.embedding_batch_size, cache_size=cfg.embedding_cache_size))


def scores(qrels: list, run: list, measures=LOCOMO_MEASURES) -> dict[str, float]:
    """Aggregate measures; run rows are (qid, doc, rank) and score = -rank keeps the engine's order."""
    q = [Qrel(str(a), str(b), int(c)) for a, b, c in qrels]
    r = [ScoredDoc(str(a), str(b), -float(c)) for a, b, c in run]
    return {str(k): v for k, v in ir_measures.calc_aggregate(measures, q, r).items()}


# -- LoCoMo -----------------------------------------------------------------------------------------

def ingest_locomo(engine: MemoryEngine, conv: dict, fmt: str) -> tuple[dict[str, str], float, int]:
    """Save each chat session in one call; returns dia_id -> memory id, seconds, exact dups skipped."""
    sid = conv["sample_id"]
    dia_to_id: dict[str, str] = {}
    elapsed = 0.0
    dups = 0
    for chat in bench_locomo.sessions(conv, fmt):
        started = time.perf_counter()
        result = engine.save([text for _, text in chat], session_id=sid)
        elapsed += time.perf_counter() - started
        for s in result["saved"]:
            dia_to_id[chat[s["index"]][0]] = str(s["id"])
        for s in result["skipped"]:  # exact duplicate: the evidence lives in the kept memory
            dia_to_id[chat[s["index"]][0]] = str(s["duplicate_of"])
            dups += 1
    return dia_to_id, elapsed, dups


def recall_run(engine: MemoryEngine, conv: dict, *, top_k: int = 10, max_tokens: int | None = None, **knobs) -> tuple[list, dict]:
    run, returned = [], {}
    for q in bench_locomo.questions(conv):
        result = engine.recall(q["question"], session_id=conv["sample_id"], top_k=top_k, max_tokens=max_tokens, **knobs)
        run += [(q["qid"], str(m["id"]), m["rank"]) for m in result["memories"]]
        returned[q["qid"]] = result["total_tokens"]
    return run, returned


def bench_locomo_engine(work: Path, convs: list[dict], fmt: str, repeats: int, knobs: dict | None = None) -> dict:
    """Ingest (median of `repeats` fresh databases) then recall with the last one."""
    knobs = knobs or {}
    rates = []
    for rep in range(repeats):
        qrels, run, returned, conv_tokens = [], [], {}, {}
        turns = seconds = dups = 0
        for conv in convs:
            db = work / f"locomo-{fmt}-{rep}-{conv['sample_id']}.db"
            for old in work.glob(db.name + "*"):  # a fresh database: a reused one would skip every turn as a duplicate
                old.unlink()
            with new_engine(db) as engine:
                engine.save(["warm-up"], session_id="warmup")  # load the model before timing
                dia_to_id, elapsed, d = ingest_locomo(engine, conv, fmt)
                texts = [t if isinstance(t, str) else t["content"] for chat in bench_locomo.sessions(conv, fmt) for _, t in chat]
                turns += len(texts)
                seconds += elapsed
                dups += d
                if rep == repeats - 1:
                    qrels += bench_locomo.qrels_for(conv, dia_to_id)
                    r, ret = recall_run(engine, conv, **knobs)
                    run += r
                    returned.update(ret)
                    whole = engine.tokens.count("\n".join(texts))
                    conv_tokens.update({q["qid"]: whole for q in bench_locomo.questions(conv)})
        rates.append(turns / seconds)
    metrics = scores(qrels, run)
    by_cat = {}
    for cat in bench_locomo.EVIDENCE_CATEGORIES:
        ids = {q["qid"] for c in convs for q in bench_locomo.questions(c) if q["category"] == cat}
        if ids:
            by_cat[cat] = scores([x for x in qrels if x[0] in ids], [x for x in run if x[0] in ids], [R @ 10])["R@10"]
    return {
        "format": fmt, "turns": turns, "questions": len(returned), "exact_duplicates_skipped": dups,
        "ingest_per_s": statistics.median(rates), "ingest_per_s_runs": rates, **metrics,
        "R@10_by_category": by_cat,
        "tokens_returned_mean": statistics.mean(returned.values()),
        "tokens_conversation_mean": statistics.mean(conv_tokens.values()),
        "_qrels": qrels, "_run": run,
    }


def run_tc051(args: list[str], python: Path = BASELINE_PY) -> None:
    """scripts/bench_baseline_tinycontext05.py with ``args`` in TinyContext 0.5.1's own venv."""
    subprocess.run([str(python), str(Path(__file__).with_name("bench_baseline_tinycontext05.py")), *args], check=True, env={
        # Offline: 0.5.1 would download o200k_base and, failing that, silently count characters as tokens.
        "HF_HUB_OFFLINE": "1", "TIKTOKEN_CACHE_DIR": str(SHARED / "tiktoken" / "cache"), "PATH": "/usr/bin:/bin"})


def bench_baseline(work: Path, quick: bool, fmt: str) -> dict:
    if not BASELINE_PY.exists():
        return {"error": f"{BASELINE_PY} missing: create the 0.5.1 venv (see scripts/bench_baseline_tinycontext05.py)"}
    out = work / "baseline.json"
    run_tc051(["--out", str(out), "--format", fmt] + (["--quick"] if quick else []))
    data = json.loads(out.read_text())
    convs = data["conversations"].values()
    return {
        "turns": sum(c["turns"] for c in convs), "dropped_near_duplicates": sum(c["dropped_near_duplicates"] for c in convs),
        "ingest_per_s": sum(c["turns"] for c in convs) / sum(c["ingest_s"] for c in convs),
        **scores(data["qrels"], data["run"]), "tokens_returned_mean": statistics.mean(data["returned_tokens"].values()),
    }


# -- recall latency ---------------------------------------------------------------------------------

def real_pool(convs: list[dict]) -> list[str]:
    """Real sentences: LoCoMo turns and SciFact abstract sentences."""
    pool = [t for c in convs for chat in bench_locomo.sessions(c) for _, t in chat]
    with open(SCIFACT / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            pool += [s.strip() + "." for s in json.loads(line)["text"].split(". ") if 40 <= len(s) <= 300]
    return pool


def synthetic_memories(n: int, texts: list[str], vectors: np.ndarray, rng: random.Random) -> tuple[list[str], np.ndarray]:
    """n memories, each two random real sentences joined (unique text, real vocabulary), with the
    normalised sum of their real vectors."""
    pairs = [(rng.randrange(len(texts)), rng.randrange(len(texts))) for _ in range(n)]
    vecs = vectors[[a for a, _ in pairs]] + vectors[[b for _, b in pairs]]
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return [f"{texts[a]} {texts[b]}" for a, b in pairs], vecs.astype(np.float32)


def insert_memories(engine: MemoryEngine, session: str, contents: list[str], vectors: np.ndarray) -> None:
    """Insert memories into the engine's own tables, as save() does (same rows, same triggers that
    feed FTS5, same vec0 table) but with the vectors given.

    Recall cost does not depend on vector values (every vector of the session is scored) and BM25
    cost depends on term statistics, which stay those of real text.
    """
    _ = engine.embedder  # binds the model to the database first: vectors written by hand must carry its identity
    with engine.store.write() as conn:
        conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (session, now_iso()))
        for start in range(0, len(contents), 5000):
            chunk = contents[start:start + 5000]
            counts = engine.tokens.count_many(chunk)
            stamp = now_iso()
            for content, vec, count in zip(chunk, vectors[start:start + 5000], counts):
                mid = conn.execute(
                    "INSERT INTO memories(session_id, content, tags, metadata, content_hash, tokens, created_at, updated_at, version)"
                    " VALUES (?, ?, '[]', '{}', ?, ?, ?, ?, 1)", (session, content, _content_hash(content), count, stamp, stamp)).lastrowid
                conn.execute("INSERT INTO memory_vectors(memory_id, session_id, embedding) VALUES (?, ?, ?)", (mid, session, vec.tobytes()))


def fill_session(engine: MemoryEngine, session: str, n: int, texts: list[str], vectors: np.ndarray, rng: random.Random) -> None:
    """n synthetic memories (:func:`synthetic_memories`) inserted into ``session``."""
    insert_memories(engine, session, *synthetic_memories(n, texts, vectors, rng))


def percentiles(values: list[float]) -> dict:
    arr = np.array(values)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95))}


def bench_latency(work: Path, convs: list[dict], sizes: list[int], queries_per_round: int, rounds: int) -> dict:
    rng = random.Random(7)
    pool = real_pool(convs)
    rng.shuffle(pool)
    pool = pool[:3000]
    questions = [q["question"] for c in convs for q in c["qa"]]
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        questions += [json.loads(line)["text"] for line in f]
    rng.shuffle(questions)
    fresh = iter(questions)
    out = {}
    with new_engine(work / "pool.db") as engine:
        started = time.perf_counter()
        vectors = engine.embedder.embed_documents(pool)
        out["pool"] = {"texts": len(pool), "embed_s": time.perf_counter() - started}
    # Saving new memories into a big session also pays a nearest-neighbour scan (near-duplicate check).
    new_memories = [f"Note {i}: {t}" for i, t in enumerate(questions[-200:])]
    for n in sizes:
        db = work / f"latency-{n}.db"
        db.unlink(missing_ok=True)
        with new_engine(db) as engine:
            started = time.perf_counter()
            fill_session(engine, "big", n, pool, vectors, rng)
            build_s = time.perf_counter() - started
            engine.recall("warm up the model and page cache", session_id="big")
            fresh_ms, repeat_ms, inner_ms = [], [], []
            for _ in range(rounds):
                qs = [next(fresh) for _ in range(queries_per_round)]
                f_ms, r_ms = [], []
                for q in qs:  # first time: query embedding computed
                    t = time.perf_counter()
                    res = engine.recall(q, session_id="big")
                    f_ms.append((time.perf_counter() - t) * 1000)
                    inner_ms.append(res["elapsed_ms"])
                for q in qs:  # again: embedding served from the engine's LRU cache
                    t = time.perf_counter()
                    engine.recall(q, session_id="big")
                    r_ms.append((time.perf_counter() - t) * 1000)
                fresh_ms.append(percentiles(f_ms))
                repeat_ms.append(percentiles(r_ms))
            batch = [new_memories.pop() for _ in range(10)]
            t = time.perf_counter()
            engine.save(batch, session_id="big")
            save_ms = (time.perf_counter() - t) * 1000 / len(batch)
        out[n] = {
            "build_s": build_s,
            "fresh_p50_ms": statistics.median(p["p50"] for p in fresh_ms),
            "fresh_p95_ms": statistics.median(p["p95"] for p in fresh_ms),
            "cached_p50_ms": statistics.median(p["p50"] for p in repeat_ms),
            "cached_p95_ms": statistics.median(p["p95"] for p in repeat_ms),
            "rounds": rounds, "queries_per_round": queries_per_round,
            "save_ms_per_memory_into_session": save_ms,
        }
        db.unlink(missing_ok=True)
    return out


# -- SciFact ----------------------------------------------------------------------------------------

def load_scifact(split: str) -> tuple[list[dict], dict[str, str], list[tuple[str, str, int]]]:
    corpus = [json.loads(line) for line in open(SCIFACT / "corpus.jsonl", encoding="utf-8")]
    queries = {q["_id"]: q["text"] for q in map(json.loads, open(SCIFACT / "queries.jsonl", encoding="utf-8"))}
    qrels = []
    for line in open(SCIFACT / "qrels" / f"{split}.tsv", encoding="utf-8").read().splitlines()[1:]:
        qid, doc, rel = line.split("\t")
        qrels.append((qid, doc, int(rel)))
    wanted = {q for q, _, _ in qrels}
    return corpus, {q: t for q, t in queries.items() if q in wanted}, qrels


def doc_text(doc: dict) -> str:
    return f"{doc['title']}\n{doc['text']}".strip()


def index_scifact(engine: MemoryEngine, corpus: list[dict], batch: int = 500) -> tuple[dict[str, str], float]:
    """Save the corpus; returns memory id -> corpus id and docs/s."""
    id_to_doc: dict[str, str] = {}
    started = time.perf_counter()
    for s in range(0, len(corpus), batch):
        chunk = corpus[s:s + batch]
        result = engine.save([doc_text(d) for d in chunk], session_id="scifact")
        for item in result["saved"]:
            id_to_doc[str(item["id"])] = chunk[item["index"]]["_id"]
    return id_to_doc, len(corpus) / (time.perf_counter() - started)


def scifact_db(work: Path, reuse: bool) -> tuple[Path, dict[str, str], float | None]:
    """The indexed corpus: built once per work dir (reused with --reuse-db)."""
    db, mapping = work / "scifact.db", work / "scifact-ids.json"
    if reuse and db.exists() and mapping.exists():
        return db, json.loads(mapping.read_text()), None
    db.unlink(missing_ok=True)
    corpus, _, _ = load_scifact("test")
    with new_engine(db) as engine:
        id_to_doc, rate = index_scifact(engine, corpus)
    mapping.write_text(json.dumps(id_to_doc))
    return db, id_to_doc, rate


def scifact_ndcg(engine: MemoryEngine, id_to_doc: dict[str, str], queries: dict[str, str], qrels: list, **knobs) -> float:
    run = []
    for qid, text in queries.items():
        result = engine.recall(text, session_id="scifact", top_k=10, max_tokens=UNLIMITED, **knobs)
        run += [(qid, id_to_doc[str(m["id"])], m["rank"]) for m in result["memories"]]
    return scores(qrels, run, [nDCG @ 10])["nDCG@10"]


def bench_scifact(work: Path, reuse: bool, quick: bool) -> dict:
    db, id_to_doc, rate = scifact_db(work, reuse)
    _, queries, qrels = load_scifact("test")
    if quick:
        queries = dict(list(queries.items())[:50])
        qrels = [q for q in qrels if q[0] in queries]
    out = {"docs": len(id_to_doc), "queries": len(queries), "index_docs_per_s": rate}
    with new_engine(db) as engine:
        for name, weight in (("default", None), ("bm25_only", 0.0), ("dense_only", 1.0)):
            out[f"nDCG@10_{name}"] = scifact_ndcg(engine, id_to_doc, queries, qrels, dense_weight=weight)
        # The default ranking before the relevance floor and score cliff end answers early: what the
        # ranking levers score apart from the token cut.
        out["nDCG@10_no_cut"] = scifact_ndcg(engine, id_to_doc, queries, qrels, min_dense=0.0, score_cliff=0.0)
    return out


# -- report -----------------------------------------------------------------------------------------

def table(results: dict) -> str:
    lines = []
    if "locomo" in results:
        r = results["locomo"]
        lines += ["LoCoMo dev (%d turns, %d questions, memory format %s)" % (r["turns"], r["questions"], r["format"]),
                  "  ingest          %8.1f memories/s (median of %s)" % (r["ingest_per_s"], ", ".join(f"{x:.1f}" for x in r["ingest_per_s_runs"])),
                  "  R@5 %.3f  R@10 %.3f  nDCG@10 %.3f  MRR@10 %.3f" % (r["R@5"], r["R@10"], r["nDCG@10"], r["RR@10"]),
                  "  R@10 by category " + ", ".join(f"{k}: {v:.3f}" for k, v in r["R@10_by_category"].items()),
                  "  tokens returned (top 10) %.0f vs whole conversation %.0f (%.1f%%)" % (
                      r["tokens_returned_mean"], r["tokens_conversation_mean"], 100 * r["tokens_returned_mean"] / r["tokens_conversation_mean"])]
    if "baseline" in results:
        b = results["baseline"]
        if "error" in b:
            lines.append("TinyContext 0.5.1: " + b["error"])
        else:
            lines += ["TinyContext 0.5.1 on LoCoMo (same run)",
                      "  ingest %.1f memories/s, R@10 %.3f, nDCG@10 %.3f, dropped %d of %d turns as near-duplicates" % (
                          b["ingest_per_s"], b["R@10"], b["nDCG@10"], b["dropped_near_duplicates"], b["turns"])]
            if "locomo" in results:
                r = results["locomo"]
                lines.append("  ratio ours/0.5.1: ingest x%.1f, R@10 %+.3f (%.3f vs %.3f)" % (
                    r["ingest_per_s"] / b["ingest_per_s"], r["R@10"] - b["R@10"], r["R@10"], b["R@10"]))
    if "latency" in results:
        lat = results["latency"]
        lines.append("Recall latency, one session (pool of %d real texts embedded in %.0fs)" % (lat["pool"]["texts"], lat["pool"]["embed_s"]))
        lines.append("  %8s %12s %12s %12s %12s %14s" % ("memories", "fresh p50", "fresh p95", "cached p50", "cached p95", "save/memory"))
        for n, v in lat.items():
            if n != "pool":
                lines.append("  %8s %10.1fms %10.1fms %10.1fms %10.1fms %12.1fms" % (
                    n, v["fresh_p50_ms"], v["fresh_p95_ms"], v["cached_p50_ms"], v["cached_p95_ms"], v["save_ms_per_memory_into_session"]))
    if "scifact" in results:
        s = results["scifact"]
        rate = "reused index" if s["index_docs_per_s"] is None else f"{s['index_docs_per_s']:.1f} docs/s"
        lines += [f"SciFact test ({s['docs']} docs, {s['queries']} queries, indexing {rate})",
                  "  nDCG@10 default %.4f  (no floor/cliff %.4f)  BM25 only %.4f  dense only %.4f" % (
                      s["nDCG@10_default"], s["nDCG@10_no_cut"], s["nDCG@10_bm25_only"], s["nDCG@10_dense_only"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--only", default="locomo,baseline,latency,scifact", help="comma list of parts")
    parser.add_argument("--quick", action="store_true", help="smoke run: one conversation, 1k/10k latency, 50 SciFact queries")
    parser.add_argument("--json", type=Path, help="write all figures here")
    parser.add_argument("--format", choices=bench_locomo.FORMATS, default="plain", help="how a LoCoMo turn becomes a memory")
    parser.add_argument("--repeats", type=int, default=3, help="LoCoMo ingest runs, fresh databases (median)")
    parser.add_argument("--rounds", type=int, default=3, help="latency rounds of fresh queries (median of p50/p95)")
    parser.add_argument("--workdir", type=Path, help="keep databases here (default: a temp dir, removed)")
    parser.add_argument("--reuse-db", action="store_true", help="reuse the SciFact index in --workdir")
    args = parser.parse_args(argv)
    parts = set(args.only.split(","))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    convs = bench_locomo.load()[: 1 if args.quick else None]
    results: dict = {"command": " ".join(sys.argv)}
    try:
        if "locomo" in parts:
            results["locomo"] = bench_locomo_engine(work, convs, args.format, 1 if args.quick else args.repeats)
        if "baseline" in parts:
            results["baseline"] = bench_baseline(work, args.quick, args.format)
        if "latency" in parts:
            sizes = [1000, 10000] if args.quick else [1000, 10000, 100000]
            results["latency"] = bench_latency(work, bench_locomo.load(), sizes, 20 if args.quick else 50, args.rounds)
        if "scifact" in parts:
            results["scifact"] = bench_scifact(work, args.reuse_db, args.quick)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if args.json:
        write_json(args.json, results)
    return results


def write_json(path: Path, results: dict) -> None:
    """The figures without the working state a part keeps under ``_`` keys."""
    clean = {k: ({kk: vv for kk, vv in v.items() if not str(kk).startswith("_")} if isinstance(v, dict) else v) for k, v in results.items()}
    path.write_text(json.dumps(clean, indent=2, default=str))


if __name__ == "__main__":
    main()

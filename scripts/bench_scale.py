"""Scale points (100k, 1M, 10M memories in one session): built through the bulk import path, then
recall measured in a fresh process.

    python scripts/bench_scale.py --memories 1000000 --workdir /tmp/scale1m          # build (resumes) + measure
    python scripts/bench_scale.py --memories 1000000 --workdir /tmp/scale1m --reuse  # measure only

How the memories are made (the 10M set is synthetic, so exactly): a pool of real sentences (LoCoMo
turns and SciFact abstract sentences, ``bench_engine.real_pool``; the 5,509 distinct ones after a
seeded shuffle of at most 20,000) is embedded once by the real MiniLM (kept as
``<workdir>/../pool-vectors.npy`` beside the pool texts, shared by every scale point). Memory i of
chunk c (seeded by c) is two pool sentences a, b drawn at random and joined; its vector is
normalise(v_a + v_b + noise), noise Gaussian with norm ~0.05 of the sum (so recombined pairs drawn
twice do not tie exactly). Text and vector are imported together through
``MemoryEngine.import_memories`` (the documented bulk path: vectors reused, nothing re-embedded) in
calls of 1,000, with ``dedup_mode="off"``. The build resumes where an earlier run stopped.

Recall is measured in a fresh process (so RSS is what recall needs): ``WARMUPS`` warm-up recalls (the
first, timed as ``first_recall_s``, loads the model and the session's codes), then fresh queries
(LoCoMo questions and SciFact queries, embedded by the real model; warm-ups and timed queries never
repeat one): recall() p50/p95 with default settings, dense-only and BM25-only, RSS, DB size, and the
recall@10 of the two-stage dense search against exact brute force over the stored float32 vectors
(``--exact 0`` skips it). scripts/bench_scale_suite.py runs every point, TinyContext 0.5.1 on the
10k point's memories and questions, and the ingest, import and serving benchmarks in one command.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine  # noqa: E402
import bench_locomo  # noqa: E402
from tinycontext import MemoryEngine, TinyContextConfig  # noqa: E402
from tinycontext.models.embedder import Embedder  # noqa: E402
from tinycontext.models.hub import resolve_model  # noqa: E402

SESSION = "big"


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def config(work: Path, **extra) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=work / "scale.db", models_dir=work / "models", **extra)


def real_embedder(cfg: TinyContextConfig) -> Embedder:
    # Documents pinned to the float32 graph (whatever the default): the pool's vectors (pool-vectors.npy,
    # kept across builds) and the built databases were made on it, so those stay reusable.
    return Embedder(resolve_model(cfg.embedding_model, cfg.models_dir), cache_size=0, int8_documents=False)


POOL_MAX = 20_000
NOISE = 0.05


def pool(work: Path) -> tuple[list[str], np.ndarray]:
    """The real sentences and their real MiniLM vectors, embedded once and kept beside the workdir."""
    texts_file, vectors_file = work.parent / "pool-texts.json", work.parent / "pool-vectors.npy"
    if texts_file.exists() and vectors_file.exists():
        return json.loads(texts_file.read_text()), np.load(vectors_file)
    texts = sorted(set(bench_engine.real_pool(bench_locomo.load())))
    random.Random(11).shuffle(texts)
    texts = texts[:POOL_MAX]
    vectors = real_embedder(config(work)).embed_documents(texts, progress=True).astype(np.float32)
    np.save(vectors_file, vectors)
    texts_file.write_text(json.dumps(texts))
    return texts, vectors


def chunk_memories(c: int, size: int, texts: list[str], vectors: np.ndarray) -> list[dict]:
    """Chunk ``c`` of the synthetic set (see the module docstring): the same for every build."""
    rng = np.random.default_rng(c)
    a, b = rng.integers(0, len(texts), size), rng.integers(0, len(texts), size)
    sums = vectors[a] + vectors[b]
    noise = rng.standard_normal(sums.shape).astype(np.float32)
    sums += noise * (NOISE * np.linalg.norm(sums, axis=1, keepdims=True) / np.linalg.norm(noise, axis=1, keepdims=True))
    sums /= np.linalg.norm(sums, axis=1, keepdims=True)
    return [{"content": f"{texts[i]} {texts[j]}", "uid": f"scale-{c}-{k}", "vector": v.astype("<f4").tobytes()}
            for k, (i, j, v) in enumerate(zip(a.tolist(), b.tolist(), sums))]


def build(work: Path, n: int, batch: int) -> dict:
    cfg = config(work, dedup_mode="off")
    texts, vectors = pool(work)
    with MemoryEngine(cfg, embedder=PoolEmbedder(real_embedder(cfg))) as engine:
        have = engine.store.read("SELECT count(*) FROM memories WHERE session_id = ?", (SESSION,))[0][0]
        started, imported = time.perf_counter(), 0
        with tqdm(total=n, initial=have, desc="importing", unit="memory", mininterval=30) as bar:
            for c in range(have // batch, -(-n // batch)):
                result = engine.import_memories(chunk_memories(c, min(batch, n - c * batch), texts, vectors), session_id=SESSION)
                assert result["embedded"] == 0, "the bulk path must not re-embed"
                imported += len(result["ids"])
                bar.update(len(result["ids"]) + len(result["skipped"]))
        seconds = time.perf_counter() - started
        # What a user runs after a bulk build (`tinycontext optimize`): one full-text segment, and the BM25 postings
        # snapshot from postings.MIN_MEMORIES.
        optimized = time.perf_counter()
        merged = engine.store.optimize()
        optimize_s = time.perf_counter() - optimized
    return {"memories": have + imported, "imported_now": imported, "pool_texts": len(texts), "import_s": seconds,
            "imports_per_s": imported / seconds if seconds else None, "optimize_s": optimize_s,
            "postings": merged["postings"] is not None, "loadavg": os.getloadavg(),
            "peak_rss_mb_build": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class PoolEmbedder:
    """The real embedder's identity and query embeddings; the bulk import brings every document vector."""

    def __init__(self, real: Embedder):
        self.real, self.identity, self.dimensions = real, real.identity, real.dimensions

    def embed_query(self, text: str) -> np.ndarray:
        return self.real.embed_query(text)

    def embed_documents(self, texts, *, progress: bool = False) -> np.ndarray:
        raise AssertionError("the bulk import must not embed documents")


def read_only(work: Path):
    """A read-only connection to the point's database with sqlite-vec loaded (vec0 tables readable)."""
    import sqlite_vec
    import sqlean

    conn = sqlean.connect(f"file:{work / 'scale.db'}?mode=ro", uri=True)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    return conn


def stored_vectors(conn, rows_per_slice: int = 50_000):
    """The session's stored float32 vectors as (ids, matrix) slices."""
    cursor = conn.execute("SELECT memory_id, embedding FROM memory_vectors WHERE session_id = ?", (SESSION,))
    while rows := cursor.fetchmany(rows_per_slice):
        yield np.array([r[0] for r in rows], np.int64), np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1)


def stored_memories(work: Path) -> tuple[list[str], np.ndarray]:
    """Every memory of the session (text, stored vector) in id order: the workload another engine is given."""
    conn = read_only(work)
    try:
        slices = list(stored_vectors(conn))
        texts = dict(conn.execute("SELECT id, content FROM memories WHERE session_id = ?", (SESSION,)))
    finally:
        conn.close()
    ids = np.concatenate([i for i, _ in slices])
    order = np.argsort(ids)
    return [texts[int(i)] for i in ids[order]], np.concatenate([m for _, m in slices])[order]


def exact_top(work: Path, queries: np.ndarray, k: int) -> list[list[int]]:
    """Brute force over every stored float32 vector of the session (read in slices)."""
    best_ids = np.zeros((len(queries), 0), np.int64)
    best_scores = np.zeros((len(queries), 0), np.float32)
    conn = read_only(work)
    for ids, mat in stored_vectors(conn):
        mat = mat / np.linalg.norm(mat, axis=1, keepdims=True)
        scores = queries @ mat.T
        best_ids = np.concatenate([best_ids, np.broadcast_to(ids, scores.shape)], axis=1)
        best_scores = np.concatenate([best_scores, scores], axis=1)
        top = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
        best_ids = np.take_along_axis(best_ids, top, 1)
        best_scores = np.take_along_axis(best_scores, top, 1)
    conn.close()
    return best_ids.tolist()


def fresh_questions(seed: int) -> list[str]:
    """LoCoMo questions and SciFact queries, shuffled; each measurement takes its own, never reused."""
    questions = [q["question"] for c in bench_locomo.load() for q in c["qa"]]
    with open(bench_engine.SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        questions += [json.loads(line)["text"] for line in f]
    random.Random(seed).shuffle(questions)
    return questions


QUESTION_SEED = 5
WARMUPS = 5


def warmup_and_timed_questions(queries_n: int) -> tuple[list[str], list[str]]:
    """The warm-ups (the list's last ``WARMUPS``) and the default-setting timed questions (its first
    ``queries_n``) of a measurement: what another engine is timed on to compare with this point."""
    questions = fresh_questions(QUESTION_SEED)
    return questions[-WARMUPS:], questions[:queries_n]


def measure(work: Path, queries_n: int, exact_n: int, cache_max: int, codes_max: int) -> dict:
    cfg = config(work, vector_cache_max=cache_max, vector_codes_max=codes_max)
    questions = fresh_questions(QUESTION_SEED)
    out = {"db_mb": sum(p.stat().st_size for p in work.glob("scale.db*")) / 2**20, "rss_mb_open": None}
    with MemoryEngine(cfg) as engine:
        out["rss_mb_open"] = rss_mb()
        for i, q in enumerate(questions[-WARMUPS:]):
            t = time.perf_counter()
            engine.recall(q, session_id=SESSION)
            if i == 0:  # loads the model and the session's quantised copy
                out["first_recall_s"] = time.perf_counter() - t
        out["rss_mb_loaded"] = rss_mb()
        fresh = iter(questions[:-WARMUPS])
        for name, weight in (("default", None), ("dense_only", 1.0), ("bm25_only", 0.0)):
            ms, cpu_ms = [], []
            for _ in range(queries_n):
                q = next(fresh)
                t, c = time.perf_counter(), time.process_time()
                engine.recall(q, session_id=SESSION, dense_weight=weight)
                ms.append((time.perf_counter() - t) * 1000)
                cpu_ms.append((time.process_time() - c) * 1000)
            # CPU time (all threads) is what a recall costs on an idle machine, less the overlap of
            # query embedding and BM25; wall time on a shared box mostly measures the others' load.
            out[f"recall_{name}_ms"] = {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)), "n": len(ms),
                                        "cpu_p50": float(np.percentile(cpu_ms, 50)), "cpu_p95": float(np.percentile(cpu_ms, 95))}
        out["rss_mb_after"] = rss_mb()
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["quantized_vectors"] = engine.index.quantized_size
        out["vector_codes_max"] = codes_max
        out["memories"] = engine.store.read("SELECT count(*) FROM memories WHERE session_id = ?", (SESSION,))[0][0]
        out["exact_queries"] = exact_n
        if not exact_n:
            return out
        sample = [next(fresh) for _ in range(exact_n)]
        qv = np.stack([engine.embedder.embed_query(q) for q in sample])
        qv /= np.linalg.norm(qv, axis=1, keepdims=True)
        got = [[i for i, _ in engine.candidate_search.dense(q, SESSION, [], 10)] for q in sample]
    want = exact_top(work, qv, 10)
    out["dense_recall@10_vs_exact"] = statistics.mean(len(set(g) & set(w)) / 10 for g, w in zip(got, want))
    return out


def fresh_measure(work: Path, queries_n: int, exact_n: int, cache_max: int | None = None, codes_max: int | None = None) -> dict:
    """``measure`` in a fresh process, so RSS and first-recall time are a recall process's own."""
    cache_max = TinyContextConfig().vector_cache_max if cache_max is None else cache_max
    codes_max = TinyContextConfig().vector_codes_max if codes_max is None else codes_max
    proc = subprocess.run([sys.executable, __file__, "--measure-only", "--workdir", str(work), "--queries", str(queries_n),
                           "--exact", str(exact_n), "--cache-max", str(cache_max), "--codes-max", str(codes_max)],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--memories", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--reuse", action="store_true", help="measure the database already in --workdir")
    parser.add_argument("--queries", type=int, default=100, help="fresh queries per recall setting")
    parser.add_argument("--exact", type=int, default=50, help="queries checked against exact search (0: none)")
    parser.add_argument("--cache-max", type=int, default=TinyContextConfig().vector_cache_max,
                        help="vector_cache_max for recall (sessions above it, or above vector_exact_max, are held quantised)")
    parser.add_argument("--codes-max", type=int, default=TinyContextConfig().vector_codes_max,
                        help="vector_codes_max for recall (quantised sessions up to it hold their codes in RAM at 4 bits)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the fresh recall process
    args = parser.parse_args()
    if args.measure_only:
        print(json.dumps(measure(args.workdir, args.queries, args.exact, args.cache_max, args.codes_max)))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join(sys.argv), "loadavg_start": os.getloadavg()}
    if not args.reuse:
        result["build"] = build(args.workdir, args.memories, args.batch)
        print(json.dumps(result["build"]), flush=True)
    result["recall"] = fresh_measure(args.workdir, args.queries, args.exact, args.cache_max, args.codes_max)
    result["loadavg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

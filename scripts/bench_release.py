"""Release benchmark: the speed and quality figures of issues 9 and 13 in one run, each next to its target.

    python scripts/bench_release.py --workdir /work/coord/bench/release --db1m /work/coord/bench/scale1m \\
        --db100k /work/coord/bench/latency-100k.db --json notes/bench_engine_runs/release.json --notes notes/bench_release.md

Run it on an idle machine (nothing else running): wall-clock figures are the point. Parts (--only):

  embed     embedder texts/s (wall, all cores) per length vs the measured GEMM limit (scripts/bench_embed.py)
  ingest    LoCoMo dev ingest turns/s (each chat session one save()) and R@10; TinyContext 0.5.1 on the
            same conversations in the same run (scripts/bench_baseline_tinycontext05.py)
  recall    recall p50/p95, fresh queries, default settings: a 10k session alone, a 10k session among
            five (50k memories), a 100k session; TinyContext 0.5.1 on the same 50k memories
  scale     1M memories, prebuilt (--db1m: a folder holding scale.db, see scripts/bench_scale.py):
            recall p50/p95, RSS, recall@10 of the quantised search vs exact, in a fresh process
  serve     REST and MCP (streamable HTTP), 1/4/16 clients, recall/mixed/save mixes, errors, lost writes (scripts/bench_serve.py)
  scifact   SciFact: abstracts/s ingest and test nDCG@10 of the default hybrid (BM25 only, dense only)

The 10k/50k/100k databases are built here from real sentences (bench_engine.synthetic_memories) unless
the paths given exist; --db100k keeps the 100k one between runs. --small runs every part on small
sizes (a smoke test of the command, minutes on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_embed  # noqa: E402
import bench_engine  # noqa: E402
import bench_locomo  # noqa: E402
import bench_scale  # noqa: E402
import bench_serve  # noqa: E402

PARTS = "embed,ingest,recall,scale,serve,scifact"
# (figure, target, "<=" or ">="): checked in the table.
TARGETS = {
    "embed_pct_of_limit": (80.0, ">="),
    "ingest_turns_per_s": (250.0, ">="),
    "ingest_pct_of_limit": (80.0, ">="),
    "ingest_vs_051": (10.0, ">="),
    "scifact_abstracts_per_s": (40.0, ">="),
    "recall_10k_p50_ms": (8.0, "<="),
    "recall_10k_p95_ms": (15.0, "<="),
    "recall_10k_of_50k_p50_ms": (8.0, "<="),
    "recall_10k_of_50k_p95_ms": (15.0, "<="),
    "recall_100k_p50_ms": (25.0, "<="),
    "recall_1m_p50_ms": (100.0, "<="),
    "rss_1m_mb": (1024.0, "<="),
    "recall@10_1m_vs_exact": (0.99, ">="),
    "scifact_ndcg@10": (0.725, ">="),
}
# Issue 9's "no loss elsewhere" figures, measured by the same run.
TARGETS_ISSUE9 = {"scifact_ndcg@10": (0.725, ">="), "recall_10k_of_50k_p50_ms": (20.0, "<="), "ingest_turns_per_s": (100.0, ">=")}


def timed_recalls(engine, session: str, queries: list[str]) -> dict:
    engine.recall("warm up the model and the page cache", session_id=session)
    ms, cpu = [], []
    for q in queries:
        t, c = time.perf_counter(), time.process_time()
        engine.recall(q, session_id=session)
        ms.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)), "queries": len(ms),
            "cpu_p50_ms": float(np.percentile(cpu, 50)), "cpu_p95_ms": float(np.percentile(cpu, 95))}


def part_embed(small: bool) -> dict:
    lengths = [32, 128]
    result = bench_embed.main(["--variants", "default", "--lengths", *map(str, lengths), "--texts", "32" if small else "128",
                               "--repeats", "1" if small else "2"])
    cpus = os.cpu_count() or 1
    out = {"cpus": cpus, "per_length": {}}
    for length in lengths:
        row, limit = result["variants"]["default"][length], result["limit"][length]
        # The limit on all cores: each core at the best fp32 GEMM rate measured on the model's shapes.
        limit_texts = cpus * max(limit["ort_fp32_gflops"] or 0, limit["numpy_fp32_gflops"]) / row["gflop_per_text"]
        out["per_length"][length] = {"texts_per_s": row["texts_per_s"], "limit_texts_per_s": limit_texts,
                                     "pct_of_limit": 100 * row["texts_per_s"] / limit_texts, "gemm": limit}
    out["pct_of_limit"] = min(v["pct_of_limit"] for v in out["per_length"].values())
    return out


def part_ingest(work: Path, small: bool) -> dict:
    convs = bench_locomo.load()
    ours = bench_engine.bench_locomo_engine(work / "ingest", convs[:1] if small else convs, "plain", repeats=1)
    base = bench_engine.bench_baseline(work, quick=small, fmt="plain")  # the same conversations
    # What one turn costs the model: FLOPs at its token length (the ingest limit is the GEMM limit over these).
    from tokenizers import Tokenizer

    from tinycontext.models.hub import builtin_bundle

    tok = Tokenizer.from_file(str(builtin_bundle().tokenizer_file))
    tok.no_padding()
    texts = [t for c in (convs[:1] if small else convs) for chat in bench_locomo.sessions(c, "plain") for _, t in chat]
    gflop = float(np.mean([bench_embed.flops_per_text(len(e.ids)) for e in tok.encode_batch(texts)])) / 1e9
    out = {"turns": ours["turns"], "turns_per_s": ours["ingest_per_s"], "R@10": ours["R@10"], "R@5": ours["R@5"], "gflop_per_turn": gflop,
           "tc051": base}
    if "error" not in base:
        out["ratio_vs_051"] = ours["ingest_per_s"] / base["ingest_per_s"]
    return out


def latency_db(path: Path, sessions: int, per_session: int, pool: list[str], vectors: np.ndarray, seed: int) -> tuple[Path, dict]:
    """A database of ``sessions`` sessions s0.. of ``per_session`` memories (reused when present), and
    the rows, for TinyContext 0.5.1."""
    rng = random.Random(seed)
    rows = {f"s{i}": bench_engine.synthetic_memories(per_session, pool, vectors, rng) for i in range(sessions)}
    if not path.exists():
        with bench_engine.new_engine(path) as engine:
            for session, (contents, vecs) in rows.items():
                bench_engine.insert_memories(engine, session, contents, vecs)
    return path, rows


def part_recall(work: Path, db100k: Path | None, small: bool) -> dict:
    per = 1000 if small else 10_000
    big = 5000 if small else 100_000
    nq = 30 if small else 200
    queries = iter(bench_scale.fresh_questions(13))
    pool = bench_engine.real_pool(bench_locomo.load())
    random.Random(7).shuffle(pool)
    pool = pool[:3000]
    with bench_engine.new_engine(work / "pool.db") as engine:
        vectors = engine.embedder.embed_documents(pool)
    out: dict = {"sizes": {"alone": per, "among": 5 * per, "big": big}}
    alone, rows = latency_db(work / f"latency-{per}-alone.db", 1, per, pool, vectors, 1)
    among, _ = latency_db(work / f"latency-{per}x5.db", 5, per, pool, vectors, 2)
    big_db, _ = latency_db(db100k or work / f"latency-{big}.db", 1, big, pool, vectors, 3)
    for name, db, session in (("alone", alone, "s0"), ("among", among, "s2"), ("big", big_db, "s0")):
        with bench_engine.new_engine(db) as engine:
            out[name] = timed_recalls(engine, session, [next(queries) for _ in range(nq)])
    # TinyContext 0.5.1 on the same 10k memories and the same kind of queries, with its native sqlite-vec
    # (pysqlite3 in its venv; the output's native_sqlite_vec says whether it loaded).
    if bench_engine.BASELINE_PY.exists():
        np.save(work / "tc051-vectors.npy", np.concatenate([v for _, v in rows.values()]))
        spec = {"sessions": {s: c for s, (c, _) in rows.items()}, "vectors": str(work / "tc051-vectors.npy"), "session": "s0",
                "warmups": [next(queries)], "queries": [next(queries) for _ in range(5 if small else 100)]}
        (work / "tc051-latency.json").write_text(json.dumps(spec))
        bench_engine.run_tc051(["--latency", str(work / "tc051-latency.json"), "--out", str(work / "tc051-latency-out.json")])
        out["tc051_alone"] = json.loads((work / "tc051-latency-out.json").read_text())
    return out


def part_scale(db1m: Path, small: bool) -> dict:
    if not (db1m / "scale.db").exists():
        return {"error": f"{db1m / 'scale.db'} missing: build it first with scripts/bench_scale.py --workdir {db1m}"}
    return bench_scale.fresh_measure(db1m, 20 if small else 100, 10 if small else 50)


def part_scifact(work: Path, small: bool) -> dict:
    return bench_engine.bench_scifact(work / "scifact", reuse=False, quick=small)


def figures(results: dict) -> dict:
    """The headline figures the targets refer to."""
    f: dict = {}
    if "embed" in results:
        f["embed_pct_of_limit"] = results["embed"]["pct_of_limit"]
    if "ingest" in results:
        f["ingest_turns_per_s"] = results["ingest"]["turns_per_s"]
        if "embed" in results:  # the limit: every core at the best fp32 GEMM rate measured (short texts)
            gemm = results["embed"]["per_length"][32]["gemm"]
            limit = results["embed"]["cpus"] * max(gemm["ort_fp32_gflops"] or 0, gemm["numpy_fp32_gflops"]) / results["ingest"]["gflop_per_turn"]
            f["ingest_pct_of_limit"] = 100 * results["ingest"]["turns_per_s"] / limit
        if "ratio_vs_051" in results["ingest"]:
            f["ingest_vs_051"] = results["ingest"]["ratio_vs_051"]
    if "recall" in results:
        r = results["recall"]
        f.update({"recall_10k_p50_ms": r["alone"]["p50_ms"], "recall_10k_p95_ms": r["alone"]["p95_ms"],
                  "recall_10k_of_50k_p50_ms": r["among"]["p50_ms"], "recall_10k_of_50k_p95_ms": r["among"]["p95_ms"],
                  "recall_100k_p50_ms": r["big"]["p50_ms"]})
        if "tc051_alone" in r:
            f["recall_10k_vs_051_p50"] = r["tc051_alone"]["p50_ms"] / r["alone"]["p50_ms"]
    if "scale" in results and "error" not in results["scale"]:
        s = results["scale"]
        f.update({"recall_1m_p50_ms": s["recall_default_ms"]["p50"], "recall_1m_p95_ms": s["recall_default_ms"]["p95"],
                  "rss_1m_mb": s["peak_rss_mb"], "recall@10_1m_vs_exact": s["dense_recall@10_vs_exact"]})
    if "scifact" in results:
        s = results["scifact"]
        f.update({"scifact_ndcg@10": s["nDCG@10_default"], "scifact_abstracts_per_s": s["index_docs_per_s"]})
    return f


def table(results: dict) -> str:
    f = results["figures"]

    def check(name: str, targets: dict) -> str:
        if name not in targets or name not in f:
            return ""
        goal, op = targets[name]
        met = f[name] >= goal if op == ">=" else f[name] <= goal
        return f"{op} {goal:g} {'met' if met else '**missed**'}"

    lines = [f"Release benchmark ({results['started']} UTC, {results['wall_s']:.0f} s, load average "
             f"{results['loadavg_start'][0]:.2f} -> {results['loadavg_end'][0]:.2f}, {os.cpu_count()} CPUs)", "",
             "| figure | measured | target (issue 13) | issue 9 |", "|---|---|---|---|"]
    for name, value in f.items():
        lines.append(f"| {name} | {value:.4g} | {check(name, TARGETS)} | {check(name, TARGETS_ISSUE9)} |")
    if "embed" in results:
        lines += ["", "Embedder (default, all cores) vs the fp32 GEMM limit of all cores:"]
        lines += [f"- {n} tokens: {v['texts_per_s']:.0f} texts/s of {v['limit_texts_per_s']:.0f} = {v['pct_of_limit']:.0f} %"
                  for n, v in results["embed"]["per_length"].items()]
    if "ingest" in results:
        i = results["ingest"]
        lines += ["", f"LoCoMo ingest: {i['turns']} turns at {i['turns_per_s']:.1f} turns/s, R@10 {i['R@10']:.3f}, R@5 {i['R@5']:.3f}"]
        if "ratio_vs_051" in i:
            lines.append(f"- TinyContext 0.5.1, same turns, same run: {i['tc051']['ingest_per_s']:.1f} turns/s (ours x{i['ratio_vs_051']:.1f}), "
                         f"R@10 {i['tc051']['R@10']:.3f}")
        else:
            lines.append("- TinyContext 0.5.1: " + i["tc051"]["error"])
    if "recall" in results:
        r = results["recall"]
        lines += ["", "Recall, fresh queries, default settings (wall p50 / p95 ms; CPU p50 / p95 ms):"]
        for name, label in (("alone", f"{r['sizes']['alone']} memories, one session"),
                            ("among", f"{r['sizes']['alone']} of {r['sizes']['among']} memories, five sessions"),
                            ("big", f"{r['sizes']['big']} memories, one session")):
            v = r[name]
            lines.append(f"- {label}: {v['p50_ms']:.1f} / {v['p95_ms']:.1f} (CPU {v['cpu_p50_ms']:.1f} / {v['cpu_p95_ms']:.1f})")
        if "tc051_alone" in r:
            lines.append(f"- TinyContext 0.5.1, the same {r['sizes']['alone']} memories ({r['tc051_alone']['queries']} queries): "
                         f"{r['tc051_alone']['p50_ms']:.1f} / {r['tc051_alone']['p95_ms']:.1f}")
    if "scale" in results:
        s = results["scale"]
        if "error" in s:
            lines += ["", "1M: " + s["error"]]
        else:
            lines += ["", f"1M memories: recall p50/p95 {s['recall_default_ms']['p50']:.0f} / {s['recall_default_ms']['p95']:.0f} ms "
                      f"(dense only {s['recall_dense_only_ms']['p50']:.0f}, BM25 only {s['recall_bm25_only_ms']['p50']:.0f}), "
                      f"peak RSS {s['peak_rss_mb']:.0f} MB, DB {s['db_mb']:.0f} MB, first recall {s['first_recall_s']:.0f} s, "
                      f"recall@10 vs exact {s['dense_recall@10_vs_exact']:.3f}"]
    if "serve" in results:
        lines += ["", "Servers (seeded with %d memories, %g s per cell):" % (results["serve"]["seed_memories"], results["serve"]["seconds_per_cell"])]
        lines += [f"- {r['server']} {r['mix']}, {r['clients']} clients: {r['per_s']:.1f}/s, p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, "
                  f"errors {r['errors']} (load {r['loadavg_1m']})" if "mix" in r else
                  f"- {r['server']}: {r['acknowledged_saves']} saves acknowledged, {r['memories_after']} memories after, lost {r['lost_writes']}"
                  for r in results["serve"]["results"]]
    if "scifact" in results:
        s = results["scifact"]
        lines += ["", f"SciFact ({s['docs']} abstracts, {s['queries']} test queries): ingest {s['index_docs_per_s']:.1f} abstracts/s, "
                  f"nDCG@10 default {s['nDCG@10_default']:.4f} (no floor/cliff {s['nDCG@10_no_cut']:.4f}), BM25 only {s['nDCG@10_bm25_only']:.4f}, dense only {s['nDCG@10_dense_only']:.4f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--only", default=PARTS, help=f"comma list of parts ({PARTS})")
    parser.add_argument("--workdir", type=Path, required=True, help="databases and intermediate files")
    parser.add_argument("--db1m", type=Path, default=Path("/work/coord/bench/scale1m"), help="folder holding the prebuilt 1M scale.db")
    parser.add_argument("--db100k", type=Path, help="the 100k-memory database (built there when missing)")
    parser.add_argument("--small", action="store_true", help="small sizes: a smoke test of the command")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--notes", type=Path, help="write the table here (markdown)")
    args = parser.parse_args(argv)
    parts = args.only.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                     "loadavg_start": os.getloadavg(), "small": args.small, "part_s": {}}
    runners = {"embed": lambda: part_embed(args.small), "ingest": lambda: part_ingest(args.workdir, args.small),
               "recall": lambda: part_recall(args.workdir, args.db100k, args.small),
               "scale": lambda: part_scale(args.db1m, args.small),
               "serve": lambda: bench_serve.run(2.0 if args.small else 5.0, [1, 4, 16], 1000, "fast", ["rest", "mcp"], list(bench_serve.MIXES)),
               "scifact": lambda: part_scifact(args.workdir, args.small)}
    for part in parts:
        t = time.perf_counter()
        results[part] = runners[part]()
        results["part_s"][part] = time.perf_counter() - t
        print(f"{part}: {results['part_s'][part]:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    results["wall_s"] = time.perf_counter() - started
    results["loadavg_end"] = os.getloadavg()
    results["figures"] = figures(results)
    text = table(results)
    print(text)
    if args.notes:
        args.notes.write_text("# Release benchmark (scripts/bench_release.py)\n\n" + text + "\n\nCommand: `" + results["command"] + "`\n")
    if args.json:
        bench_engine.write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()

"""Issue 25 in one command: the scale points, TinyContext 0.5.1 on the 10k point, ingest, bulk import, serving.

    python scripts/bench_scale_suite.py --workdir /tmp/suite \\
        --point 10k=/work/coord/scale-data/w10k --point 100k=/work/coord/scale-data/w100k \\
        --point 1m=/work/coord/scale-data/w1m --point 10m=/work/coord/scale-data/w10m \\
        --build-record 10m=/work/coord/idle/scale10m_build.json \\
        --json notes/bench_engine_runs/scale_suite.json --notes notes/bench_scale_suite.md

Run it on an idle machine, through /work/coord/offline: wall-clock figures are the point. Parts (--only):

  scale   each --point NAME=WORKDIR (a database scripts/bench_scale.py built; none is written) measured in a
          fresh process (bench_scale.fresh_measure): first recall, 5 warm-ups, then fresh questions through
          recall() with defaults: p50/p95 wall and CPU, dense-only and BM25-only, RSS, DB size, recall@10 of
          the dense search vs exact float search (--exact queries); build time from --build-record NAME=FILE
          (the --json a bench_scale.py build wrote), when given
  tc051   TinyContext 0.5.1 (its own venv, --tc051-python; its native sqlite-vec loaded through pysqlite3)
          on the --tc051-point's memories (texts and stored vectors, inserted with the vectors, nothing
          re-embedded) and the same warm-ups and timed questions as that point, recall_memories with
          defaults; --tc051-passes passes, each ours (a fresh bench_scale process) and theirs, in
          alternating order; ours / theirs p50, p95 and the ratio per pass
  ingest  scripts/bench_ingest.py: saves of 20 LoCoMo turns vs plain fp32 onnxruntime (longest, pad128)
  import  scripts/bench_import.py: import of an export with vectors (built once under --workdir, untimed)
  serve   scripts/bench_serve.py: REST and MCP (streamable HTTP), 1/4/16 clients, recall/mixed/save mixes,
          errors, lost writes

Each part runs in its own process(es); the load average is recorded before and after each part (and each
point and pass). The JSON is rewritten after every part, so a stopped run keeps what it measured; a part
that fails is recorded with its error, the others still run, and the exit status is 1.

0.5.1's venv (once, online; running it is offline):
    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/bench-venv-0.5.1
    /work/bench-venv-0.5.1/bin/pip install tinysuite-context==0.5.1 onnx pysqlite3-binary
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(SCRIPTS.parent), str(SCRIPTS)]  # this checkout's package, not another editable install
import bench_engine  # noqa: E402
import bench_scale  # noqa: E402

PARTS = "scale,tc051,ingest,import,serve"


def named_paths(values: list[str], option: str) -> dict[str, Path]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{option} takes NAME=PATH, got {value!r}")
        out[name] = Path(path)
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def script(name: str, args: list[str], out: Path) -> dict:
    """One of the benchmark scripts in a fresh process, its --json read back."""
    subprocess.run([sys.executable, str(SCRIPTS / name), *args, "--json", str(out)], check=True)
    return json.loads(out.read_text())


def timed(fn) -> dict:
    before, t = load(), time.perf_counter()
    result = fn()
    return {**result, "loadavg_before": before, "loadavg_after": load(), "part_wall_s": round(time.perf_counter() - t, 1)}


def part_scale(points: dict[str, Path], records: dict[str, Path], queries: int, exact: int) -> dict:
    out = {}
    for name, work in points.items():
        if not (work / "scale.db").exists():
            out[name] = {"error": f"{work / 'scale.db'} missing: build it with scripts/bench_scale.py --workdir {work}"}
            continue
        out[name] = timed(lambda: bench_scale.fresh_measure(work, queries, exact))
        if name in records:
            out[name]["build"] = json.loads(records[name].read_text())["build"]
    return {"points": out}


def tc051_latency(work: Path, i: int, python: Path) -> dict:
    out = work / f"tc051-latency-out-{i}.json"
    bench_engine.run_tc051(["--latency", str(work / "tc051-latency.json"), "--out", str(out)], python)
    return json.loads(out.read_text())


def part_tc051(work: Path, point: Path, queries: int, passes: int, python: Path) -> dict:
    if not python.exists():
        return {"error": f"{python} missing: create the 0.5.1 venv (see this script's docstring)"}
    if not (point / "scale.db").exists():
        return {"error": f"{point / 'scale.db'} missing: 0.5.1 is timed on that point's memories"}
    warmups, questions = bench_scale.warmup_and_timed_questions(queries)
    texts, vectors = bench_scale.stored_memories(point)
    np.save(work / "tc051-vectors.npy", vectors)
    spec = {"sessions": {bench_scale.SESSION: texts}, "vectors": str(work / "tc051-vectors.npy"), "session": bench_scale.SESSION,
            "warmups": warmups, "queries": questions}
    (work / "tc051-latency.json").write_text(json.dumps(spec))
    rows = []
    for i in range(passes):
        row: dict = {"order": ["ours", "tc051"] if i % 2 == 0 else ["tc051", "ours"]}
        for side in row["order"]:
            if side == "ours":
                r = timed(lambda: bench_scale.fresh_measure(point, queries, 0))
                d = r["recall_default_ms"]
                row["ours"] = {"p50_ms": d["p50"], "p95_ms": d["p95"], "cpu_p50_ms": d["cpu_p50"], "cpu_p95_ms": d["cpu_p95"],
                               "queries": d["n"], "memories": r["memories"], "loadavg_before": r["loadavg_before"],
                               "loadavg_after": r["loadavg_after"]}
            else:
                row["tc051"] = timed(lambda: tc051_latency(work, i, python))
        row["ratio_p50"] = row["tc051"]["p50_ms"] / row["ours"]["p50_ms"]
        row["ratio_p95"] = row["tc051"]["p95_ms"] / row["ours"]["p95_ms"]
        rows.append(row)
    return {"point": str(point), "memories": len(texts), "warmups": len(warmups), "queries": len(questions), "passes": rows}


def part_import(work: Path, sizes: list[int], pool_from: Path | None) -> dict:
    root = work / "import"
    root.mkdir(parents=True, exist_ok=True)
    for name in ("pool-texts.json", "pool-vectors.npy"):  # the scale points' pool, else bench_scale embeds it anew
        if pool_from and (pool_from / name).exists() and not (root / name).exists():
            shutil.copy2(pool_from / name, root / name)
    rows = []
    for n in sizes:
        if not (root / f"export{n}.jsonl").exists():
            subprocess.run([sys.executable, str(SCRIPTS / "bench_import.py"), "--root", str(root), "--memories", str(n), "build"], check=True)
        rows.append(timed(lambda: script("bench_import.py", ["--root", str(root), "--memories", str(n), "import"], root / f"import{n}.json")))
    return {"rows": rows}


def loads(r: dict) -> str:
    return f"{r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f}"


def table(results: dict) -> str:
    """The notes table (markdown) of a run's JSON."""
    lines = [f"Issue 25 suite ({results['started']} UTC, {results.get('wall_s', 0):.0f} s, load average "
             f"{results['loadavg_start'][0]:.2f} -> {results.get('loadavg_end', results['loadavg_start'])[0]:.2f}, "
             f"{results['cpus']} CPUs, commit {results['commit']})", "", f"Command: `{results['command']}`"]
    if "scale" in results:
        lines += ["", "Scale points (fresh process each; recall() with defaults; wall p50 / p95 ms, CPU p50 in brackets):", "",
                  "| point | memories | DB MB | build | first recall s | default | dense-only | BM25-only | RSS after / peak MB | "
                  "recall@10 vs exact | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in results["scale"].get("points", {}).items():
            if "error" in r:
                lines.append(f"| {name} | {r['error']} |||||||||")
                continue
            b = r.get("build")
            build = "not recorded"
            if b and b.get("imports_per_s"):
                build = f"{b['import_s']:.0f} s, {b['imports_per_s']:,.0f}/s" + (
                    f" (resumed: {b['imported_now']:,} of {b['memories']:,} in that run)" if b["imported_now"] != b["memories"] else "") + (
                    f" (**record of {b['memories']:,} memories**)" if b["memories"] != r["memories"] else "") + (
                    f", optimize {b['optimize_s']:.0f} s" if b.get("optimize_s") is not None else "")
            cells = [f"{r[f'recall_{k}_ms']['p50']:.1f} / {r[f'recall_{k}_ms']['p95']:.1f} ({r[f'recall_{k}_ms']['cpu_p50']:.1f})"
                     for k in ("default", "dense_only", "bm25_only")]
            exact = (f"{r['dense_recall@10_vs_exact']:.3f} ({r['exact_queries']} q)" if "dense_recall@10_vs_exact" in r else "not checked")
            lines.append(f"| {name} | {r['memories']:,} | {r['db_mb']:,.0f} | {build} | {r['first_recall_s']:.1f} | {' | '.join(cells)} | "
                         f"{r['rss_mb_after']:.0f} / {r['peak_rss_mb']:.0f} | {exact} | {loads(r)} |")
    if "tc051" in results:
        t = results["tc051"]
        lines += ["", "TinyContext 0.5.1 on the same workload: " + (t["error"] if "error" in t else
                  f"{t['memories']:,} memories of {t['point']}, {t['warmups']} warm-ups, {t['queries']} fresh questions, "
                  "recall_memories / recall() with defaults, wall ms:")]
        if "passes" in t:
            lines += ["", "| pass (order) | ours p50 / p95 (CPU p50) | 0.5.1 p50 / p95 (CPU p50) | ratio p50 / p95 | 0.5.1 native sqlite-vec | "
                      "load ours / 0.5.1 |", "|---|---|---|---|---|---|"]
            for i, p in enumerate(t["passes"], start=1):
                o, c = p["ours"], p["tc051"]
                lines.append(f"| {i} ({' then '.join(p['order'])}) | {o['p50_ms']:.1f} / {o['p95_ms']:.1f} ({o['cpu_p50_ms']:.1f}) | "
                             f"{c['p50_ms']:.1f} / {c['p95_ms']:.1f} ({c['cpu_p50_ms']:.1f}) | x{p['ratio_p50']:.1f} / x{p['ratio_p95']:.1f} | "
                             f"{'yes' if c['native_sqlite_vec'] else '**no**'} | {loads(o)} / {loads(c)} |")
    if "ingest" in results:
        i = results["ingest"]
        lines += ["", "Agent-sized saves (scripts/bench_ingest.py): " + (i["error"] if "error" in i else
                  f"{i['calls']} calls of <= {i['per_call']} LoCoMo turns, turns/s (load {loads(i)}):")]
        if "rounds" in i:
            lines += ["", "| round | ours (stored) | ORT longest | ORT pad128 | ours / longest | ours / pad128 |", "|---|---|---|---|---|---|"]
            lines += [f"| {n} | {r['ours']['turns_per_s']:.1f} ({r['ours']['stored']}) | {r['ort_longest']['turns_per_s']:.1f} | "
                      f"{r['ort_pad128']['turns_per_s']:.1f} | x{r['ratio_vs_ort_longest']:.2f} | x{r['ratio_vs_ort_pad128']:.2f} |"
                      for n, r in enumerate(i["rounds"], start=1)]
    if "import" in results:
        m = results["import"]
        lines += ["", "Bulk import of an export with vectors (scripts/bench_import.py, nothing re-embedded)" + (": " + m["error"] if "error" in m else ":")]
        if "rows" in m:
            lines += ["", "| memories | wall /s | CPU /s | load |", "|---|---|---|---|"]
            lines += [f"| {r['memories']:,} | {r['per_s_wall']:,} | {r['per_s_cpu']:,} | {loads(r)} |" for r in m["rows"]]
    if "serve" in results:
        s = results["serve"]
        lines += ["", "Serving (scripts/bench_serve.py): " + (s["error"] if "error" in s else
                  f"{s['seed_memories']} seeded memories, {s['seconds_per_cell']:g} s a cell, /s and p95 ms (load {loads(s)}):")]
        if "results" in s:
            cells = [r for r in s["results"] if "mix" in r]
            clients = sorted({r["clients"] for r in cells})
            lines += ["", "| server | mix | " + " | ".join(f"{n} clients /s, p95" for n in clients) + " | errors |",
                      "|---|---|" + "---|" * (len(clients) + 1)]
            for key in dict.fromkeys((r["server"], r["mix"]) for r in cells):
                row = {r["clients"]: r for r in cells if (r["server"], r["mix"]) == key}
                lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{row[n]['per_s']:.1f}, {row[n]['p95_ms']:.1f}" if n in row else "—"
                                                                     for n in clients) + f" | {sum(r['errors'] for r in row.values())} |")
            lines += [""] + [f"- {r['server']}: {r['acknowledged_saves']} saves acknowledged, {r['memories_after']} memories after "
                             f"(seed {r['seed']}): {r['lost_writes']} lost" for r in s["results"] if "lost_writes" in r]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--only", default=PARTS, help=f"comma list of parts ({PARTS})")
    parser.add_argument("--workdir", type=Path, required=True, help="intermediate files (0.5.1's input, import exports, part JSON)")
    parser.add_argument("--point", action="append", default=[], metavar="NAME=WORKDIR", help="a built scale point (repeat)")
    parser.add_argument("--build-record", action="append", default=[], metavar="NAME=FILE", help="bench_scale.py --json of that point's build")
    parser.add_argument("--queries", type=int, default=100, help="fresh questions per recall setting")
    parser.add_argument("--exact", type=int, default=30, help="questions checked against exact float search")
    parser.add_argument("--tc051-point", default="10k", help="the --point whose memories and questions 0.5.1 is timed on")
    parser.add_argument("--tc051-python", type=Path, default=bench_engine.BASELINE_PY)
    parser.add_argument("--tc051-passes", type=int, default=2)
    parser.add_argument("--ingest-turns", type=int, default=1500)
    parser.add_argument("--ingest-rounds", type=int, default=2)
    parser.add_argument("--import-memories", type=int, nargs="+", default=[5000, 20_000])
    parser.add_argument("--serve-seconds", type=float, default=4.0)
    parser.add_argument("--serve-clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--notes", type=Path, help="write the tables here (markdown)")
    args = parser.parse_args(argv)
    points, records = named_paths(args.point, "--point"), named_paths(args.build_record, "--build-record")
    parts = args.only.split(",")
    if unknown := set(parts) - set(PARTS.split(",")):
        parser.error(f"unknown parts {sorted(unknown)}")
    if missing := [str(f) for f in records.values() if not f.is_file()]:
        parser.error(f"--build-record files missing: {missing}")
    if "tc051" in parts and args.tc051_point not in points:
        parser.error(f"--tc051-point {args.tc051_point} is not among the --point names {sorted(points)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    # Every process started here (points, scripts) imports this checkout's package too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS.parent), os.environ.get("PYTHONPATH")]))
    commit = subprocess.run(["git", "-C", str(SCRIPTS.parent), "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    results: dict = {"command": " ".join(sys.argv if argv is None else ["scripts/bench_scale_suite.py", *argv]),
                     "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "commit": commit, "cpus": os.cpu_count(),
                     "loadavg_start": load()}
    runners = {
        "scale": lambda: part_scale(points, records, args.queries, args.exact),
        "tc051": lambda: part_tc051(args.workdir, points[args.tc051_point], args.queries, args.tc051_passes, args.tc051_python),
        "ingest": lambda: script("bench_ingest.py", ["--turns", str(args.ingest_turns), "--rounds", str(args.ingest_rounds)],
                                 args.workdir / "ingest.json"),
        "import": lambda: part_import(args.workdir, args.import_memories, next(iter(points.values())).parent if points else None),
        "serve": lambda: script("bench_serve.py", ["--seconds", str(args.serve_seconds), "--clients", *map(str, args.serve_clients)],
                                args.workdir / "serve.json"),
    }
    started, failed = time.perf_counter(), False
    for part in parts:
        try:
            results[part] = timed(runners[part])
        except subprocess.CalledProcessError as exc:
            failed = True
            tail = (exc.stderr or "").strip().splitlines()[-3:] if isinstance(exc.stderr, str) else []
            results[part] = {"error": f"{' '.join(map(str, exc.cmd))[:200]} exited {exc.returncode}" + (": " + " / ".join(tail) if tail else "")}
        except Exception as exc:  # noqa: BLE001 - an unattended run keeps the other parts; the traceback goes to stderr
            failed = True
            traceback.print_exc()
            results[part] = {"error": f"{type(exc).__name__}: {exc}"}
        # A missing database or venv is recorded in the part (or its point) and fails the run as well.
        failed = failed or "error" in results[part] or any("error" in v for v in results[part].get("points", {}).values())
        print(f"{part}: {results[part]['part_wall_s'] if 'part_wall_s' in results[part] else 'failed'} s, load {load()[0]:.2f}", flush=True)
        results["wall_s"], results["loadavg_end"] = time.perf_counter() - started, load()
        args.json.write_text(json.dumps(results, indent=1))
    text = table(results)
    print(text)
    if args.notes:
        args.notes.write_text("# Issue 25 benchmark suite (scripts/bench_scale_suite.py)\n\n" + text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The harness's speed targets, for a quiet machine: one command, JSON + a notes table.

    python scripts/bench_harness.py [--out notes/bench_harness] [--sweep-limit-s 560]

1. A 40-config SciFact sweep (``experiment=scifact_sweep``) from a cold cache (nothing embedded,
   nothing indexed, empty results store). If it has not finished after ``--sweep-limit-s`` it is
   stopped, and the finished jobs and the time they took are reported (no extrapolation is
   presented as a measurement).
2. The same sweep again, every job finished: target < 10 s. When step 1 was stopped, the repeat
   covers the dense weights whose four configs all finished.
3. The default config alone (``dataset=scifact force=true``) on the same cache: its live latency
   next to the same config's latency inside the sweep, and the time of one run on a built index.
   It embeds and searches every query again (the sweep's vectors and kept searches are moved away
   first), as a cold run would.
   One cold run = that time + the index build (the cold embedding of the corpus) measured in step 1:
   target sweep <= 1.5 x one cold run. (A separate cold single run would embed the corpus a second
   time, ~6 min here, and not fit the window.)

Writes ``<out>/bench_harness.json`` and ``<out>/bench_harness.md``. Launch from the repo root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT = {"dense_weight": 0.5, "rrf_k": 10.0}
PHASES = ["seconds_setup", "seconds_index", "seconds_search", "seconds_quality", "seconds_wait_alone", "seconds_timing", "seconds_probe"]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: list[str], env: dict, limit: float | None = None) -> dict:
    """Run ``python -m evals.run`` with ``args``; stop its whole process group after ``limit`` seconds."""
    started, before = time.perf_counter(), load()
    proc = subprocess.Popen([sys.executable, "-m", "evals.run", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=limit)
        stopped = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate()
        stopped = True
    except BaseException:  # interrupted: the run is in its own session, stop it too
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    return {"args": args, "seconds": round(time.perf_counter() - started, 2), "returncode": proc.returncode,
            "stopped_at_limit": stopped, "load_before": before, "load_after": load(), "log_tail": output[-3000:]}


def jobs(sweep_dir: Path) -> pd.DataFrame:
    rows = []
    for file in sorted(sweep_dir.glob("*/result.json")):
        record = json.loads(file.read_text(encoding="utf-8"))
        rows.append({**record["row"], "job": file.parent.name, "reused": "reused_run" in record,
                     "load_at_timing": record["manifest"].get("load_average_at_timing")})
    return pd.DataFrame(rows)


def latency(row) -> dict:
    return {k: round(float(row[k]), 2) for k in ("recall_p50_ms", "recall_p95_ms", "recall_p99_ms")} | {
        "load_at_timing": row["load_at_timing"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "notes" / "bench_harness")
    parser.add_argument("--sweep-limit-s", type=float, default=560.0, help="stop the cold sweep after this long")
    parser.add_argument("--experiment", default="scifact_sweep", help="the sweep preset (tiny_sweep for a smoke test)")
    parser.add_argument("--dataset", default="scifact", help="the preset's dataset, for the run alone")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-harness-"))
    env = {**os.environ, "TINYCONTEXT_EVAL_CACHE": str(work / "cache"), "TQDM_DISABLE": "1"}
    env.pop("TINYCONTEXT_EVAL_STORE", None)
    result: dict = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(), "work_dir": str(work),
                    "experiment": args.experiment,
                    "git": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}

    cold_dir = work / "cold"
    cold = run([f"experiment={args.experiment}", f"hydra.sweep.dir={cold_dir}"], env, limit=args.sweep_limit_s)
    done = jobs(cold_dir)
    total = json.loads((cold_dir / "sweep.json").read_text())["total"] if (cold_dir / "sweep.json").is_file() else None
    cold["jobs_total"] = total
    built = done[~done["index_reused"]] if len(done) else done
    cold["jobs_finished"] = len(done)
    cold["index_build_seconds"] = round(float(built["index_build_seconds"].iloc[0]), 1) if len(built) else None
    if len(done):
        cold["phase_seconds_median"] = {p: round(float(done[p].median()), 2) for p in PHASES if p in done}
        cold["run_seconds_median"] = round(float(done["run_seconds"].median()), 1)
    result["cold_sweep"] = cold

    complete = len(done) == total and not cold["stopped_at_limit"]
    if complete:
        repeat_args = [f"experiment={args.experiment}"]
    else:  # the dense weights whose rrf_k configs all finished
        counts = done.groupby("dense_weight").size() if len(done) else pd.Series(dtype=int)
        weights = [w for w, n in counts.items() if n == done["rrf_k"].nunique()]
        repeat_args = [f"experiment={args.experiment}", f"retrieval.dense_weight={','.join(f'{w:g}' for w in weights)}"] if weights else None
    if repeat_args:
        repeat = run([*repeat_args, f"hydra.sweep.dir={work / 'repeat'}"], env)
        again = jobs(work / "repeat")
        repeat["jobs"], repeat["jobs_reused"] = len(again), int(again["reused"].sum()) if len(again) else 0
        result["repeated_sweep"] = repeat

    # A cold run embeds and searches every query itself: the sweep's searches kept beside the index
    # and its vectors go first (the built index stays: its build is counted from step 1).
    for kept in (work / "cache" / "indexes").glob("*.searches-*"):
        kept.unlink()
    if (work / "cache" / "embeddings").is_dir():
        (work / "cache" / "embeddings").rename(work / "cache" / "embeddings.sweep")
    alone = run([f"dataset={args.dataset}", "force=true", f"hydra.run.dir={work / 'alone'}"], env)
    alone_row = jobs(work).query("job == 'alone'") if (work / "alone" / "result.json").is_file() else pd.DataFrame()
    result["default_alone"] = alone
    if len(alone_row):
        row = alone_row.iloc[0]
        alone["latency"] = latency(row)
        alone["phase_seconds"] = {p: round(float(row[p]), 2) for p in PHASES if p in row}
        inside = done[(done["dense_weight"] == DEFAULT["dense_weight"]) & (done["rrf_k"] == DEFAULT["rrf_k"])] if len(done) else done
        result["default_inside_sweep"] = latency(inside.iloc[0]) if len(inside) else None
        if cold["index_build_seconds"] is not None:
            one_cold = cold["index_build_seconds"] + alone["seconds"]
            result["one_cold_run_seconds"] = round(one_cold, 1)
            # A stopped sweep still bounds the ratio from below: it took longer than it ran.
            key = "sweep_over_one_run" if complete else "sweep_over_one_run_at_least"
            result[key] = round(cold["seconds"] / one_cold, 2)
            if not complete and len(done) and total:
                # A projection, labelled as one: the unfinished jobs at the finished jobs' median pace
                # (2 joblib workers), excluding the job that built the index.
                pace = float(done[done["index_reused"]]["run_seconds"].median() if done["index_reused"].any()
                             else done["run_seconds"].median()) / 2
                result["projected_sweep_seconds"] = round(cold["seconds"] + (total - len(done)) * pace)
                result["projected_sweep_over_one_run"] = round(result["projected_sweep_seconds"] / one_cold, 2)
    result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    (args.out / "bench_harness.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    (args.out / "bench_harness.md").write_text(table(result), encoding="utf-8")
    print(table(result))


def table(r: dict) -> str:
    cold, rep, alone = r["cold_sweep"], r.get("repeated_sweep"), r["default_alone"]
    lines = [f"# Harness speed targets ({r['started']}, commit {r['git'][:10]}, {r['cpus']} CPUs)", "",
             "| what | measured | target | load average before -> after |", "|---|---|---|---|"]
    status = "stopped at the limit" if cold["stopped_at_limit"] else "finished"
    lines.append(f"| cold sweep ({r['experiment']}) | {cold['seconds']:.0f} s, {cold['jobs_finished']}/{cold['jobs_total']} jobs ({status}); "
                 f"index build (cold embedding) {cold['index_build_seconds']} s | <= 1.5 x one cold run | "
                 f"{cold['load_before']} -> {cold['load_after']} |")
    if rep:
        lines.append(f"| repeated sweep, {rep['jobs']} jobs all finished ({rep['jobs_reused']} reused) | {rep['seconds']:.1f} s | "
                     f"< 10 s | {rep['load_before']} -> {rep['load_after']} |")
    where = "on the built index" if cold["index_build_seconds"] is not None else "(the stopped sweep built no index: built here)"
    lines.append(f"| default config alone {where} | {alone['seconds']:.0f} s | | {alone['load_before']} -> {alone['load_after']} |")
    if "one_cold_run_seconds" in r:
        ratio = r.get("sweep_over_one_run")
        ratio = ratio if ratio is not None else f"> {r.get('sweep_over_one_run_at_least')} (sweep stopped)"
        lines.append(f"| one cold run = index build + run alone | {r['one_cold_run_seconds']:.0f} s | | |")
        lines.append(f"| sweep / one cold run | {ratio} | <= 1.5 | |")
        if "projected_sweep_seconds" in r:
            lines.append(f"| projection (not a measurement): the rest at the finished jobs' median pace | "
                         f"{r['projected_sweep_seconds']} s, ratio {r['projected_sweep_over_one_run']} | <= 1.5 | |")
    if alone.get("latency"):
        a, i = alone["latency"], r.get("default_inside_sweep")
        lines += ["", "Default config (w 0.5, k 10), live recall latency p50 / p95 / p99 (ms):", "",
                  f"- alone: {a['recall_p50_ms']} / {a['recall_p95_ms']} / {a['recall_p99_ms']} (load at timing {a['load_at_timing']})"]
        if i:
            lines.append(f"- inside the sweep: {i['recall_p50_ms']} / {i['recall_p95_ms']} / {i['recall_p99_ms']} "
                         f"(load at timing {i['load_at_timing']})")
    if cold.get("phase_seconds_median"):
        lines += ["", "Median seconds per sweep job by phase: "
                  + ", ".join(f"{k.removeprefix('seconds_')} {v}" for k, v in cold["phase_seconds_median"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

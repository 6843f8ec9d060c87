"""Latency stability of repeated runs of one config: a markdown row per run directory (p50, p95 with
its bootstrap CI, timing passes and how many were flagged, the 1-min load and competing cores
sampled during the passes, and the probes' peak RSS: median, min-max of the fresh processes). The
runs are read as `report` reads them: hashes checked, figures derived again from the per-query values.

    for i in 1 2 3 4 5; do python -m evals.run dataset=scifact \
        results_store=$TINYCONTEXT_EVAL_CACHE/stability-$i.sqlite hydra.run.dir=multirun/eval/stability/$i; done
    python scripts/latency_stability.py multirun/eval/stability
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evals.report import load_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a folder holding one run directory per repetition")
    rows, _, records = load_results(parser.parse_args().runs)
    print("| run | p50 ms | p95 ms [95% CI] | passes (flagged) | 1-min load | competing cores | peak RSS MB (probes) |")
    print("|---|---|---|---|---|---|---|")
    passes_of = {str(record["row"]["job"]): record["latency"]["passes"] for record in records}
    for _, r in rows.iterrows():
        passes = passes_of[str(r["job"])]
        load = [p["load1_before"] for p in passes]
        cores = [p["competing_cores"] for p in passes]
        print(f"| {r['job']} | {r['recall_p50_ms']:.1f} | {r['recall_p95_ms']:.1f} [{r['recall_p95_ms_ci_low']:.1f}, "
              f"{r['recall_p95_ms_ci_high']:.1f}] | {len(passes)} ({sum(bool(p['loaded']) for p in passes)}) | "
              f"{min(load):.1f}-{max(load):.1f} | {min(cores):.2f}-{max(cores):.2f} | "
              f"{r['peak_rss_mb']:.0f} ({r['peak_rss_mb_min']:.0f}-{r['peak_rss_mb_max']:.0f}) |")


if __name__ == "__main__":
    main()

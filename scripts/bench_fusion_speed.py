"""Recall latency of the learned fusion, before and after a change to tinycontext/retrieval/conversation.py,
in one run on the same databases: LoCoMo dev conversations (the README recipe, one database each,
built by ``bench_locomo_cv.open_conversation``), every question recalled at the defaults with
``learned`` as the checkout has it, with ``learned`` from ``--before`` (that commit's
conversation.py loaded beside it and swapped in), and with ``rrf``, interleaved question by question.

Query vectors are cached after a first, untimed pass, so the figures are the ranking's cost (search,
fusion, re-rank, rows, budget), not the model's. Also checks that both learned versions return the
same memories. Prints per arm the median over ``--passes`` of each pass's p50/p95, the ratio, the
time inside ``learned_rerank`` alone, and the load average before and after.

    python scripts/bench_fusion_speed.py --workdir /tmp/locomo-sig --before 6c5031e --json /tmp/speed.json
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import bench_locomo
from bench_locomo_cv import open_conversation
from tinycontext.retrieval import conversation

REPO = Path(__file__).resolve().parents[1]


def load_before(rev: str):
    """conversation.py as it was at ``rev``, as a module of the same package (its relative imports resolve)."""
    source = subprocess.check_output(["git", "-C", str(REPO), "show", f"{rev}:tinycontext/retrieval/conversation.py"], text=True)
    spec = importlib.util.spec_from_loader("tinycontext.retrieval._conversation_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "tinycontext.retrieval"
    exec(compile(source, f"{rev}:conversation.py", "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workdir", type=Path, required=True, help="conversation databases (built here unless present)")
    parser.add_argument("--before", required=True, help="git revision whose conversation.py is the 'before' arm")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    before = load_before(args.before)
    after_rerank = conversation.learned_rerank
    inside = {"before": [], "after": []}
    timing = [False]  # learned_rerank's own time is kept during the timed passes only

    def timed(arm, function):
        # A revision before the window feature takes no query_vector/vectors: pass what it accepts.
        accepted = inspect.signature(function).parameters

        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return function(*a, **{key: value for key, value in k.items() if key in accepted})
            finally:
                if timing[0]:
                    inside[arm].append((time.perf_counter() - started) * 1000)
        return wrapper

    arms = {"before": ("learned", timed("before", before.learned_rerank)), "after": ("learned", timed("after", after_rerank)),
            "rrf": ("rrf", after_rerank)}
    load_start = os.getloadavg()
    times = {arm: [[] for _ in range(args.passes)] for arm in arms}
    differing = questions = 0
    for conv in bench_locomo.load():
        engine, _ = open_conversation(args.workdir, conv, "turns", reuse=True)
        sid = conv["sample_id"]
        with engine:
            qs = [q["question"] for q in bench_locomo.questions(conv)]
            for q in qs:  # untimed: fills the query-vector cache, checks both versions agree
                got = {}
                for arm in ("before", "after"):
                    conversation.learned_rerank = arms[arm][1]
                    got[arm] = [m["id"] for m in engine.recall(q, session_id=sid)["memories"]]
                differing += got["before"] != got["after"]
                questions += 1
            timing[0] = True
            for p in range(args.passes):
                for q in qs:
                    for arm, (fusion, rerank) in arms.items():
                        conversation.learned_rerank = rerank
                        started = time.perf_counter()
                        engine.recall(q, session_id=sid, fusion=fusion)
                        times[arm][p].append((time.perf_counter() - started) * 1000)
        conversation.learned_rerank = after_rerank
        timing[0] = False
        print(sid, len(qs), "questions", flush=True)
    out = {"before_rev": args.before, "after_rev": subprocess.check_output(["git", "-C", str(REPO), "describe", "--always", "--dirty"], text=True).strip(),
           "questions": questions, "answers_differing": differing, "passes": args.passes,
           "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "cpus": os.cpu_count()}
    for arm in arms:
        out[arm] = {"p50_ms": statistics.median(float(np.percentile(t, 50)) for t in times[arm]),
                    "p95_ms": statistics.median(float(np.percentile(t, 95)) for t in times[arm])}
        if inside.get(arm):
            out[arm]["learned_rerank_p50_ms"] = float(np.percentile(inside[arm], 50))
    out["p50_before_over_after"] = out["before"]["p50_ms"] / out["after"]["p50_ms"]
    out["p50_after_over_rrf"] = out["after"]["p50_ms"] / out["rrf"]["p50_ms"]
    out["rerank_before_over_after"] = out["before"]["learned_rerank_p50_ms"] / out["after"]["learned_rerank_p50_ms"]
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()

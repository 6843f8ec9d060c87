"""LoCoMo dev: conversation recall settings with leave-one-conversation-out cross-validation.

Each conversation is saved through the public API twice: ``plain`` ("Speaker: text" strings, what
the engine could use before conversation fields) and ``turns`` (the README's recipe: each chat
session in one save call, a turn per memory with speaker, occurred_at and attachments). Then:

- a grid of recall settings on ``turns`` (default ``episode_weight`` x ``neighbour_weight`` x
  ``speaker_boost``; any ``recall()`` keyword, e.g. ``time_boost``): R@5, R@10 per question, each
  setting's paired-bootstrap difference from the defaults; leave-one-conversation-out: for each
  conversation, the setting best on the other four (mean R@10), scored on the held-out one, and
  that choice's paired difference from the defaults on the held-out questions;
- the engine defaults vs ``plain``: R@5/R@10 overall and per category with 95% bootstrap CIs, the
  paired-bootstrap CI of the difference;
- evidence recall within a token budget as the agent receives it (``recall_rendered``: the text
  and structured content an MCP/REST client gets), e.g. 300 tokens.

    python scripts/bench_locomo_cv.py --workdir /tmp/locomo-cv --json /tmp/locomo-cv.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

import bench_locomo
from bench_engine import UNLIMITED, ingest_locomo, new_engine

GRID = {"episode_weight": (0.0, 0.2, 0.3), "neighbour_weight": (0.0, 0.3, 0.5), "speaker_boost": (0.0, 0.5, 1.0)}


def evidence(conv: dict, dia_to_id: dict[str, str]) -> dict[str, tuple[int, set[str]]]:
    """qid -> (category, memory ids of its evidence); an evidence turn absent from the conversation
    stays as an id nothing can return, so it counts against recall."""
    return {q["qid"]: (q["category"], {dia_to_id.get(d, f"missing:{d}") for d in q["evidence"]}) for q in bench_locomo.questions(conv)}


def recall_of(ids: list[str], relevant: set[str], k: int) -> float:
    return len(set(ids[:k]) & relevant) / len(relevant)


def open_conversation(work: Path, conv: dict, fmt: str, reuse: bool, **config):
    """An engine on the conversation's database (built unless reused) and its dia_id -> memory id map;
    ``config``: settings of the engine (``new_engine``'s)."""
    db = work / f"cv-{fmt}-{conv['sample_id']}.db"
    ids_file = db.with_suffix(".ids.json")
    if not (reuse and db.exists() and ids_file.exists()):
        for stale in (db, ids_file):
            stale.unlink(missing_ok=True)
        with new_engine(db, **config) as engine:
            dia_to_id, _, _ = ingest_locomo(engine, conv, fmt)
        ids_file.write_text(json.dumps(dia_to_id))
    return new_engine(db, **config), json.loads(ids_file.read_text())


def bootstrap_ci(values: np.ndarray, rng: np.random.Generator, n: int) -> tuple[float, float]:
    means = values[rng.integers(0, len(values), (n, len(values)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workdir", type=Path, required=True, help="databases are kept here")
    parser.add_argument("--reuse-db", action="store_true", help="reuse the databases in --workdir")
    parser.add_argument("--budget", type=int, default=300, help="token budget for evidence recall as the agent receives it")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the CIs")
    parser.add_argument("--json", type=Path, help="write all figures here")
    parser.add_argument("--grid", type=json.loads, default=GRID, help=f"JSON: values per setting (default {json.dumps(GRID)}); {{}}: defaults and plain only")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    convs = bench_locomo.load()
    knobs = list(args.grid)
    grid = [dict(zip(knobs, values)) for values in itertools.product(*(args.grid[k] for k in knobs))] if args.grid else []
    names = ["plain", "default", *(json.dumps(g) for g in grid)]
    rows: list[dict] = []  # one per question: conv, category, then R@5/R@10 per setting, budget recall
    for conv in tqdm(convs, desc="conversations", unit="conv"):
        plain, plain_ids = open_conversation(args.workdir, conv, "plain", args.reuse_db)
        turns, turn_ids = open_conversation(args.workdir, conv, "turns", args.reuse_db)
        with plain, turns:
            ev_plain, ev_turns = evidence(conv, plain_ids), evidence(conv, turn_ids)
            for q in bench_locomo.questions(conv):
                row = {"conv": conv["sample_id"], "qid": q["qid"], "category": q["category"]}
                for name in names:
                    engine, ev = (plain, ev_plain) if name == "plain" else (turns, ev_turns)
                    knobs = {} if name in ("plain", "default") else json.loads(name)
                    got = [str(m["id"]) for m in engine.recall(q["question"], session_id=conv["sample_id"], top_k=10,
                                                               max_tokens=UNLIMITED, **knobs)["memories"]]
                    row[name] = (recall_of(got, ev[q["qid"]][1], 5), recall_of(got, ev[q["qid"]][1], 10))
                for name, engine, ev in (("plain", plain, ev_plain), ("default", turns, ev_turns)):
                    page = engine.recall_rendered(q["question"], session_id=conv["sample_id"], max_tokens=args.budget)
                    shown = [str(m["id"]) for m in page.structured["memories"]]
                    row[f"budget_{name}"] = recall_of(shown, ev[q["qid"]][1], len(shown) or 1)
                    row[f"budget_tokens_{name}"] = page.tokens
                rows.append(row)
    rng = np.random.default_rng(0)
    out: dict = {"command": " ".join(sys.argv), "questions": len(rows), "budget": args.budget}
    for name in ("plain", "default"):
        r5 = np.array([r[name][0] for r in rows])
        r10 = np.array([r[name][1] for r in rows])
        budget = np.array([r[f"budget_{name}"] for r in rows])
        out[name] = {
            "R@5": float(r5.mean()), "R@5_ci": bootstrap_ci(r5, rng, args.bootstrap),
            "R@10": float(r10.mean()), "R@10_ci": bootstrap_ci(r10, rng, args.bootstrap),
            f"evidence_recall@{args.budget}tok": float(budget.mean()),
            f"evidence_recall@{args.budget}tok_ci": bootstrap_ci(budget, rng, args.bootstrap),
            "tokens_received_mean": float(np.mean([r[f"budget_tokens_{name}"] for r in rows])),
            "R@10_by_category": {}, "R@10_by_conversation": {},
        }
        for cat in bench_locomo.EVIDENCE_CATEGORIES:
            v = np.array([r[name][1] for r in rows if r["category"] == cat])
            out[name]["R@10_by_category"][cat] = {"mean": float(v.mean()), "ci": bootstrap_ci(v, rng, args.bootstrap), "n": len(v)}
        for c in dict.fromkeys(r["conv"] for r in rows):
            out[name]["R@10_by_conversation"][c] = float(np.mean([r[name][1] for r in rows if r["conv"] == c]))
    for i, metric in ((0, "R@5"), (1, "R@10")):
        diff = np.array([r["default"][i] - r["plain"][i] for r in rows])
        out[f"paired_{metric}_default_minus_plain"] = {"mean": float(diff.mean()), "ci": bootstrap_ci(diff, rng, args.bootstrap)}
    if grid:
        table = {name: (float(np.mean([r[name][0] for r in rows])), float(np.mean([r[name][1] for r in rows]))) for name in names[2:]}
        out["grid"] = {name: {"R@5": v[0], "R@10": v[1], **{
            f"paired_{metric}_minus_default": {"mean": float(d.mean()), "ci": bootstrap_ci(d, rng, args.bootstrap)}
            for i, metric in ((0, "R@5"), (1, "R@10")) for d in [np.array([r[name][i] - r["default"][i] for r in rows])]}}
            for name, v in sorted(table.items(), key=lambda x: -x[1][1])}
        folds, held = {}, []
        for c in dict.fromkeys(r["conv"] for r in rows):
            train = [r for r in rows if r["conv"] != c]
            best = max(names[2:], key=lambda n: (np.mean([r[n][1] for r in train]), np.mean([r[n][0] for r in train])))
            test = [r for r in rows if r["conv"] == c]
            held += [r[best] for r in test]
            folds[c] = {"chosen": json.loads(best), "R@10": float(np.mean([r[best][1] for r in test])),
                        "default_R@10": float(np.mean([r["default"][1] for r in test]))}
        out["loco_cv"] = {"R@5": float(np.mean([h[0] for h in held])), "R@10": float(np.mean([h[1] for h in held])), "folds": folds}
        defaults = [r["default"] for c in folds for r in rows if r["conv"] == c]  # same question order as `held`
        for i, metric in ((0, "R@5"), (1, "R@10")):
            d = np.array([h[i] - g[i] for h, g in zip(held, defaults)])
            out["loco_cv"][f"paired_{metric}_minus_default"] = {"mean": float(d.mean()), "ci": bootstrap_ci(d, rng, args.bootstrap)}
    print(json.dumps({k: v for k, v in out.items() if k != "grid"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

"""Two runs of scripts/web_evidence.py on the same questions, compared question by question: per set and
budget, run B's recall minus run A's with a paired bootstrap 95% interval, and how many questions moved.

    python scripts/web_evidence_paired.py notes/web_evidence/s10_dev_int8 notes/web_evidence/s10_dev_float

Only the budgets and questions both runs have are compared (an older run may have other budgets).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from scifact_passages import paired_ci


def compare(a: pd.DataFrame, b: pd.DataFrame, method: str, rng: np.random.Generator) -> list[dict]:
    rows = []
    for dataset in dict.fromkeys(a.dataset):
        for budget in sorted(a[(a.dataset == dataset) & (a.method == method)].budget.dropna().unique()):
            pick = lambda df: df[(df.dataset == dataset) & (df.method == method) & (df.budget == budget)].set_index("qid").recall
            x, y = pick(a), pick(b)
            common = x.index.intersection(y.index)
            if common.empty:
                continue
            x, y = x.loc[common].to_numpy(), y.loc[common].to_numpy()
            mean, low, high = paired_ci(x, y, rng)
            rows.append({"dataset": dataset, "budget": int(budget), "questions": len(common), "A": x.mean(), "B": y.mean(),
                         "B - A": mean, "low": low, "high": high, "B better": int((y > x).sum()), "B worse": int((y < x).sum())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("a", type=Path, help="run A's output folder (its per_query.csv)")
    parser.add_argument("b", type=Path, help="run B's output folder")
    parser.add_argument("--method", default="scrape_urls", help='the method compared ("BM25 paragraphs" for the picker)')
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = compare(pd.read_csv(args.a / "per_query.csv"), pd.read_csv(args.b / "per_query.csv"), args.method,
                   np.random.default_rng(args.seed))
    for r in rows:
        print(f"{r['dataset']:8s} {r['budget']:5d} n={r['questions']:4d}  A {r['A']:.3f}  B {r['B']:.3f}  "
              f"B-A {r['B - A']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]  better {r['B better']}, worse {r['B worse']}")


if __name__ == "__main__":
    main()

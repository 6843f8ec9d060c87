"""Two runs of scripts/web_evidence.py on the same questions, compared question by question: per set and
budget, run B's recall minus run A's with a paired bootstrap 95% interval, and how many questions moved.

    python scripts/web_evidence_paired.py notes/web_evidence/s10_dev_int8 notes/web_evidence/s10_dev_float

B may be several run folders with disjoint questions, pooled: e.g. one run per held-out LoCoMo conversation, each
with the fold model that never saw it (leave-one-conversation-out), paired with one run of another model:

    python scripts/web_evidence_paired.py notes/web_evidence/s18_heldout_int8 notes/web_evidence/s18_loco_conv-4{1,2,3}

Only the budgets and questions both runs have are compared (an older run may have other budgets).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from scifact_passages import paired_ci

KEY = ["dataset", "method", "budget", "qid"]


def read_runs(folders: list[Path]) -> pd.DataFrame:
    """The per_query.csv rows of ``folders``, pooled. A question answered in two of them is an error: it would
    be counted twice (or once with whichever model came first)."""
    rows = pd.concat([pd.read_csv(f / "per_query.csv") for f in folders], ignore_index=True)
    twice = rows[rows.duplicated(KEY, keep=False)]
    if not twice.empty:
        raise ValueError(f"{len(twice.qid.unique())} questions are in more than one of {[str(f) for f in folders]}, "
                         f"e.g. {twice.qid.iloc[0]}")
    return rows


def compare(a: pd.DataFrame, b: pd.DataFrame, method: str, rng: np.random.Generator,
            rng_b: np.random.Generator | None = None) -> list[dict]:
    """Per set and budget: B - A with its paired interval (``rng``), and B's recall with its own interval
    (``rng_b``, a separate generator so the paired intervals do not depend on whether it is asked for)."""
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
            row = {"dataset": dataset, "budget": int(budget), "questions": len(common), "A": x.mean(), "B": y.mean(),
                   "B - A": mean, "low": low, "high": high, "B better": int((y > x).sum()), "B worse": int((y < x).sum())}
            if rng_b is not None:
                row["B low"], row["B high"] = paired_ci(np.zeros_like(y), y, rng_b)[1:]
            rows.append(row)
    return rows


def over_budget(rows: pd.DataFrame, method: str) -> tuple[int, int]:
    """(answers of ``method`` with a budget, those whose text or structured content has more tokens than it)."""
    answers = rows[(rows.method == method) & rows.budget.notna()]
    over = (answers.tokens > answers.budget) | (answers.get("structured_tokens", 0) > answers.budget)
    return len(answers), int(over.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("a", type=Path, help="run A's output folder (its per_query.csv)")
    parser.add_argument("b", type=Path, nargs="+", help="run B's output folder, or several with disjoint questions (pooled)")
    parser.add_argument("--method", default="scrape_urls", help='the method compared ("BM25 paragraphs" for the picker)')
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    a, b = read_runs([args.a]), read_runs(args.b)
    rows = compare(a, b, args.method, np.random.default_rng(args.seed), np.random.default_rng(args.seed + 1))
    for r in rows:
        print(f"{r['dataset']:8s} {r['budget']:5d} n={r['questions']:4d}  A {r['A']:.3f}  B {r['B']:.3f} "
              f"[{r['B low']:.3f}, {r['B high']:.3f}]  B-A {r['B - A']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]  "
              f"better {r['B better']}, worse {r['B worse']}")
    for name, run in (("A", a), ("B", b)):
        answers, over = over_budget(run, args.method)
        print(f"{name}: {over} of {answers} answers over their budget (text or structured content)")


if __name__ == "__main__":
    main()

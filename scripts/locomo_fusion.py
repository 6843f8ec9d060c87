"""Fit the learned fusion's weights (``conversation.FUSION_WEIGHTS``) on LoCoMo dev, and check them
with leave-one-conversation-out, offline from the signals ``locomo_signals.py`` kept.

Each question's candidates are built as recall builds them (``retrieval.fuse`` of the BM25 and dense
top ``--depth``, the relevance floor), then ``conversation.fusion_features`` gives the features the
engine computes, of the candidates and the turns next to them. The model is linear, fitted by a
listwise softmax loss (each question's evidence turns against its other candidates; every question
weighs the same) with L-BFGS. Prints R@5/R@10/R@100 per category for: weighted RRF + the hand-tuned
conversation re-rank (the engine's ``rrf`` fusion), the learned weights held out one conversation at a
time (LOCO-CV), and the weights fitted on all five (what ships), with paired-bootstrap CIs.

    python scripts/locomo_signals.py --workdir /tmp/locomo-sig
    python scripts/locomo_fusion.py --workdir /tmp/locomo-sig
"""

from __future__ import annotations

import argparse
import glob
import json

import numpy as np
from scipy.optimize import minimize

from tinycontext.retrieval import conversation
from tinycontext.retrieval.fusion import fuse, relevance_floor

CATEGORIES = (1, 2, 3, 4)


def hits(scores: np.ndarray, ids: np.ndarray, depth: int, positive: bool) -> list[tuple[int, float]]:
    """(id, score) best first, ties by id, as the engine's searches order them."""
    keep = np.flatnonzero(scores > 0) if positive else np.arange(len(scores))
    order = keep[np.lexsort((ids[keep], -scores[keep]))][:depth]
    return [(int(ids[i]), float(scores[i])) for i in order]


def questions(path: str, depth: int, floor: float, widen=None, adapt=None):
    """Per question: (category, candidate turns' ids, their features, evidence flags, evidence count,
    the rrf fusion's ranking). ``widen(signals, j, question, info, bm25, dense)``, if given, returns the
    BM25 and dense lists question ``j`` fuses instead of the top ``depth`` of each (a candidate lever);
    ``adapt(query_vectors)``, if given, returns the query vectors every dense signal uses instead."""
    c = dict(np.load(path, allow_pickle=False))
    if adapt is not None:
        c["qvec"] = adapt(c["qvec"])
    ids = c["ids"]
    info = {int(i): (int(e), str(s) or None) for i, e, s in zip(ids, c["episode"], c["speaker"])}
    chars = {int(i): len(str(t)) for i, t in zip(ids, c["content"])}
    vectors = dict(zip(ids.tolist(), c["vectors"]))
    evidence_ids = [set(ids[row].tolist()) for row in c["evid"]]
    out = []
    for j, question in enumerate(c["questions"]):
        question = str(question)
        bm25 = hits(c["bm25"][j], ids, depth, True)
        dense = hits(c["vectors"] @ c["qvec"][j], ids, depth, False)
        if widen is not None:
            bm25, dense = widen(c, j, question, info, bm25, dense)
        episodes = hits(c["ep_bm25"][j], c["ep_ids"], conversation.EPISODE_DEPTH, True)
        ranked, _ = relevance_floor(fuse(bm25, dense, dense_weight=0.5, k=10), floor)
        pool, rows = conversation.fusion_features(ranked, info, query=question, episode_hits=episodes, dense_hits=dense,
                                                  query_vector=c["qvec"][j], vectors=vectors, expand=True)
        rrf = conversation.rerank(fuse(bm25, dense, dense_weight=0.5, k=10) if floor <= 0 else ranked, info, query=question,
                                  episode_hits=episodes, dense_hits=dense, episode_weight=0.3, neighbour_weight=0.5,
                                  speaker_boost=0.5, expand=True)
        total = len(evidence_ids[j]) + int(c["missing"][j])
        out.append((int(c["cats"][j]), np.array([p.id for p in pool]), np.array(rows), np.array([p.id in evidence_ids[j] for p in pool]),
                    total, [p.id for p in rrf], evidence_ids[j], chars))
    return out


def fit(features: list[np.ndarray], targets: list[np.ndarray], l2: float, weigh: str = "question") -> np.ndarray:
    """Weights of the linear score minimising the listwise softmax loss (+ l2 on standardised weights).
    ``weigh``: ``question``, each question's evidence turns share one unit of weight; ``evidence``, each evidence
    turn weighs one (a question with five evidence turns, a multi-hop list, weighs five)."""
    if weigh not in ("question", "evidence"):
        raise ValueError(f"weigh must be question or evidence, got {weigh!r}")
    x = np.vstack(features)
    mu, sd = x.mean(0), x.std(0) + 1e-9
    z = (x - mu) / sd
    y = np.concatenate(targets).astype(float)
    sizes = [len(f) for f in features]
    seg = np.repeat(np.arange(len(features)), sizes)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    positives = np.add.reduceat(y, starts)
    has = positives > 0
    # each evidence turn's weight, and each question's (1, or its evidence count; 0 without evidence)
    share, mass = (y / np.maximum(positives, 1)[seg], has.astype(float)) if weigh == "question" else (y, positives)

    def loss(b):
        s = z @ b
        top = np.maximum.reduceat(s, starts)
        e = np.exp(s - top[seg])
        total = np.add.reduceat(e, starts)
        value = -(share @ s - np.sum((mass * (np.log(total) + top))[has])) / has.sum()
        p = e / total[seg] * mass[seg]
        return value + l2 * b @ b, -(z.T @ share - z.T @ p) / has.sum() + 2 * l2 * b

    b = minimize(loss, np.zeros(z.shape[1]), jac=True, method="L-BFGS-B").x
    return b / sd  # a constant shift per question does not change a ranking


def recall_rows(qs, orders) -> np.ndarray:
    """(category, R@5, R@10, R@100, characters of the top 10) per question."""
    rows = []
    for q, order in zip(qs, orders):
        found = np.array([i in q[6] for i in order], bool)
        rows.append((q[0], *(found[:k].sum() / q[4] for k in (5, 10, 100)), sum(q[7][i] for i in order[:10])))
    return np.array(rows)


def learned_order(q, weights) -> list[int]:
    s = q[2] @ weights
    return q[1][np.lexsort((q[1], -s))].tolist()


def describe(rows: np.ndarray) -> dict:
    out = {"R@5": rows[:, 1].mean(), "R@10": rows[:, 2].mean(), "R@100": rows[:, 3].mean(), "top-10 characters": rows[:, 4].mean()}
    for cat in CATEGORIES:
        mask = rows[:, 0] == cat
        out[f"cat{cat} R@10"] = rows[mask, 2].mean()
        out[f"cat{cat} R@100"] = rows[mask, 3].mean()
    return {k: round(float(v), 4) for k, v in out.items()}


def paired(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n: int = 2000) -> list[float]:
    d = a - b
    means = d[rng.integers(0, len(d), (n, len(d)))].mean(1)
    return [round(float(d.mean()), 4), round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]


def signal_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every script over the stored signals takes (this one and locomo_levers.py)."""
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--floor", type=float, default=0.3)
    parser.add_argument("--l2", type=float, default=1e-3)
    parser.add_argument("--weigh", choices=("question", "evidence"), default="question",
                        help="the fit's unit: each question (its evidence turns share it) or each evidence turn")
    return parser


def main() -> None:
    parser = signal_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--without", nargs="*", default=[], choices=conversation.FUSION_FEATURES, help="features fitted with weight 0")
    args = parser.parse_args()
    convs = [questions(path, args.depth, args.floor) for path in sorted(glob.glob(f"{args.workdir}/signals-*.npz"))]
    off = [conversation.FUSION_FEATURES.index(name) for name in args.without]
    for conv in convs:
        for q in conv:
            q[2][:, off] = 0.0
    every = [q for conv in convs for q in conv]
    rrf = recall_rows(every, [q[5] for q in every])
    held = []
    folds = []
    for i, conv in enumerate(convs):
        train = [q for k, other in enumerate(convs) if k != i for q in other]
        weights = fit([q[2] for q in train], [q[3] for q in train], args.l2, args.weigh)
        folds.append(weights)
        held += [learned_order(q, weights) for q in conv]
    loco = recall_rows(every, held)
    final = fit([q[2] for q in every], [q[3] for q in every], args.l2, args.weigh)
    int8_weights = recall_rows(every, [learned_order(q, conversation.FUSION_WEIGHTS) for q in every])
    rng = np.random.default_rng(0)
    # Candidate recall: evidence among the turns the learned fusion ranks (candidates and their neighbours).
    pool = np.array([(q[0], q[3].sum() / q[4]) for q in every])
    print(json.dumps({
        "questions": len(every), "without": args.without, "weigh": args.weigh,
        "candidate_recall": {"all": round(float(pool[:, 1].mean()), 4),
                             **{f"cat{c}": round(float(pool[pool[:, 0] == c, 1].mean()), 4) for c in CATEGORIES},
                             "mean_pool": round(float(np.mean([len(q[1]) for q in every])), 1)},
        "rrf (hand-tuned)": describe(rrf),
        "learned, LOCO-CV": describe(loco),
        "learned, FUSION_WEIGHTS (the int8 model's, fitted on all of dev)": describe(int8_weights),
        "LOCO-CV minus rrf, R@10 [95% CI]": paired(loco[:, 2], rrf[:, 2], rng),
        "LOCO-CV minus rrf, R@5 [95% CI]": paired(loco[:, 1], rrf[:, 1], rng),
        # On another model's signals (the weights a model states for itself are fitted this way), whether refitting pays.
        "LOCO-CV minus FUSION_WEIGHTS, R@10 [95% CI]": paired(loco[:, 2], int8_weights[:, 2], rng),
        "LOCO-CV minus FUSION_WEIGHTS, R@5 [95% CI]": paired(loco[:, 1], int8_weights[:, 1], rng),
        "LOCO-CV minus FUSION_WEIGHTS, cat 1 R@10 [95% CI]": paired(loco[loco[:, 0] == 1, 2], int8_weights[int8_weights[:, 0] == 1, 2], rng),
        "LOCO-CV minus FUSION_WEIGHTS, top-10 characters [95% CI]": paired(loco[:, 4], int8_weights[:, 4], rng),
        "fold weights": [np.round(w, 3).tolist() for w in folds],
        "weights fitted on all of dev": dict(zip(conversation.FUSION_FEATURES, np.round(final, 4).tolist())),
    }, indent=1))


if __name__ == "__main__":
    main()

"""A query-side linear adapter for the built-in model, fitted on frozen vectors and checked held out.

q' = normalise((I + D) q) for query vectors only: stored document vectors are unchanged. D is fitted with a
listwise softmax loss (temperature ``tau``) of a query's cosines to its candidates, the relevant ones as
targets (each query's share of one unit, every query weighing the same), plus ``l2`` x ||D||^2, by L-BFGS;
a low rank is the fitted D's truncated SVD. Training data, from the signals the other scripts keep
(queries through the engine's int8 query graph, documents as stored by its default document graph):

- LoCoMo dev (``locomo_signals.py``): each question against every turn of its conversation, evidence turns
  as targets;
- SciFact train (``scifact_passages.py``'s signals): each query against its dense top ``POOL`` documents
  (first window, as stored) and its relevant ones (the hard negatives recall ranks).

Held out, with l2 / tau / rank chosen inside every fold (``GRID``, by the dense ranking
alone: its R@10 on the training conversations, each held out from the others, for a LoCoMo fold; its
nDCG@10 over ``INNER`` folds of the training queries for a SciFact fold):

- LoCoMo leave-one-conversation-out: the adapter fitted on SciFact train + four conversations, the learned
  fusion refitted on those four with the adapted vectors (``locomo_fusion.questions(adapt=)``), scored on
  the fifth; against the shipped recipe held out the same way (``locomo_levers.compare``);
- SciFact train, ``FOLDS``-fold cross-validation: the adapter fitted on LoCoMo + the other folds; every
  train query's held-out adapted vector is written to ``--scifact-queries`` for ``scifact_passages.py
  --queries`` to rank through the shipped pipeline.

    python scripts/locomo_signals.py --workdir /tmp/locomo-sig
    python scripts/scifact_passages.py --workdir /tmp/scifact-pass --report --only none
    python scripts/fit_query_adapter.py --locomo /tmp/locomo-sig --scifact /tmp/scifact-pass \\
        --scifact-queries /tmp/scifact-pass/adapted.npz --json notes/locomo_runs/query_adapter.json
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

import locomo_fusion as lf
import locomo_levers as ll
from evals.datasets import load_beir
from scifact_passages import SCIFACT, ndcg_per_query

POOL = 100
FOLDS = 5
INNER = 3
GRID = {"l2": (3e-2, 1e-1, 3e-1), "tau": (0.1, 0.2), "rank": (4, 16, 384)}


class Group:
    """Queries, each with its candidates' vectors and target shares (rows summing to 1): ``candidates``
    is one (n, dim) matrix every query shares, or (queries, n, dim) with ``mask`` marking real ones."""

    def __init__(self, queries: np.ndarray, candidates: np.ndarray, targets: np.ndarray, mask: np.ndarray | None = None):
        self.queries, self.candidates, self.targets, self.mask = queries, candidates, targets, mask

    def scores(self, q: np.ndarray) -> np.ndarray:
        if self.mask is None:
            return q @ self.candidates.T
        return np.where(self.mask, np.einsum("mnd,md->mn", self.candidates, q), -np.inf)

    def back(self, d: np.ndarray) -> np.ndarray:
        """The gradient with respect to the queries of a gradient ``d`` with respect to their scores."""
        return d @ self.candidates if self.mask is None else np.einsum("mn,mnd->md", d, self.candidates)


def locomo_group(path: str) -> Group:
    c = np.load(path, allow_pickle=False)
    keep = c["evid"].any(1)
    ev = c["evid"][keep].astype(np.float32)
    # Every question of a conversation has the same candidates: all its turns.
    return Group(c["qvec"][keep], c["vectors"], ev / ev.sum(1, keepdims=True))


def scifact(workdir: Path):
    """SciFact train: (query ids, their stored vectors, the documents' first-window vectors, relevant doc rows).
    The signals hold train's queries first, then test's (never read here)."""
    data = load_beir(SCIFACT)
    z = np.load(workdir / "signals-192.npz")
    train = data.split_ids("train")
    pos = {d.id: i for i, d in enumerate(data.docs)}
    relevant = [[pos[d] for d, r in data.qrels[q].items() if r > 0 and d in pos] for q in train]
    return train, z["queries"][:len(train)], z["vectors"][z["is_first"]], relevant


def scifact_group(queries: np.ndarray, docs: np.ndarray, relevant: list[list[int]]) -> Group:
    top = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :POOL]
    width = POOL + max(len(r) for r in relevant)
    index = np.zeros((len(queries), width), np.int64)
    mask = np.zeros((len(queries), width), bool)
    targets = np.zeros((len(queries), width), np.float32)
    for j, rel in enumerate(relevant):
        pool = list(dict.fromkeys([*rel, *top[j].tolist()]))[:width]
        index[j, :len(pool)], mask[j, :len(pool)] = pool, True
        targets[j, :len(rel)] = 1.0 / len(rel)
    return Group(queries, docs[index], targets, mask)


def adapt(queries: np.ndarray, delta: np.ndarray | None) -> np.ndarray:
    if delta is None:
        return queries
    out = queries + queries @ delta.T
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def fit(groups: list[Group], l2: float, tau: float) -> np.ndarray:
    """D minimising the mean listwise softmax loss over every query of ``groups`` + l2 ||D||^2."""
    dim = groups[0].queries.shape[1]
    total = sum(len(g.queries) for g in groups)

    def loss(flat):
        delta = flat.reshape(dim, dim).astype(np.float32)  # float32 like the vectors: half the time
        value, grad = l2 * flat @ flat, 2 * l2 * delta
        for g in groups:
            a = g.queries + g.queries @ delta.T
            r = np.linalg.norm(a, axis=1, keepdims=True)
            q = a / r
            s = g.scores(q) / tau
            top = s.max(1, keepdims=True)
            e = np.exp(s - top)
            z = e.sum(1, keepdims=True)
            value += -((g.targets * np.where(np.isfinite(s), s, 0)).sum() - (np.log(z) + top).sum()) / total
            dq = g.back(e / z - g.targets) / (tau * total)
            da = (dq - (dq * q).sum(1, keepdims=True) * q) / r
            grad += da.T @ g.queries
        return float(value), grad.ravel().astype(np.float64)

    return minimize(loss, np.zeros(dim * dim), jac=True, method="L-BFGS-B", options={"maxiter": 200}).x.reshape(dim, dim)


def low_rank(delta: np.ndarray, rank: int) -> np.ndarray:
    """D's best rank-``rank`` approximation (truncated SVD)."""
    u, s, vt = np.linalg.svd(delta)
    return (u[:, :rank] * s[:rank]) @ vt[:rank]


def dense_recall10(queries: np.ndarray, path: str) -> float:
    """Mean R@10 of the dense ranking alone over a conversation's questions with evidence."""
    c = np.load(path, allow_pickle=False)
    keep = c["evid"].any(1)
    top = np.argsort(-(queries[keep] @ c["vectors"].T), axis=1, kind="stable")[:, :10]
    found = np.take_along_axis(c["evid"][keep], top, 1).sum(1)
    return float((found / (c["evid"][keep].sum(1) + c["missing"][keep])).mean())


def dense_ndcg10(queries: np.ndarray, docs: np.ndarray, relevant: list[list[int]]) -> float:
    """Mean nDCG@10 (binary relevance, ir_measures as scifact_passages scores) of the dense ranking alone."""
    top = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :10]
    qrels = {str(j): {str(d): 1 for d in rel} for j, rel in enumerate(relevant)}
    return float(np.mean(list(ndcg_per_query(qrels, {str(j): [str(d) for d in row] for j, row in enumerate(top.tolist())}).values())))


def best(score: dict) -> dict:
    pick = max(score, key=score.get)
    return {"l2": pick[0], "tau": pick[1], "rank": pick[2], "inner score": round(float(score[pick]), 4)}


def choose_locomo(paths: list[str], groups: list[Group], sf_group: Group) -> dict:
    """The setting of ``GRID`` with the best mean dense R@10 over these conversations, each held out from
    the others (SciFact train always in the training data)."""
    score = {}
    for l2, tau in itertools.product(GRID["l2"], GRID["tau"]):
        recall = {rank: [] for rank in GRID["rank"]}
        for i, path in enumerate(paths):
            delta = fit([g for k, g in enumerate(groups) if k != i] + [sf_group], l2, tau)
            qv = np.load(path)["qvec"]
            for rank in GRID["rank"]:
                recall[rank].append(dense_recall10(adapt(qv, low_rank(delta, rank)), path))
        score.update({(l2, tau, rank): float(np.mean(v)) for rank, v in recall.items()})
    return best(score)


def choose_scifact(groups: list[Group], sf, rows: np.ndarray) -> dict:
    """The setting of ``GRID`` with the best dense nDCG@10 over SciFact ``rows``, ``INNER``-fold (LoCoMo
    always in the training data)."""
    _, sq, docs, relevant = sf
    score = {}
    folds = np.array_split(rows, INNER)
    for l2, tau in itertools.product(GRID["l2"], GRID["tau"]):
        ndcg = {rank: 0.0 for rank in GRID["rank"]}
        for f, held in enumerate(folds):
            rest = np.concatenate([x for k, x in enumerate(folds) if k != f])
            delta = fit(groups + [scifact_group(sq[rest], docs, [relevant[r] for r in rest])], l2, tau)
            for rank in GRID["rank"]:
                ndcg[rank] += dense_ndcg10(adapt(sq[held], low_rank(delta, rank)), docs, [relevant[r] for r in held]) * len(held) / len(rows)
        score.update({(l2, tau, rank): v for rank, v in ndcg.items()})
    return best(score)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--locomo", required=True, help="locomo_signals.py's workdir")
    parser.add_argument("--scifact", type=Path, required=True, help="scifact_passages.py's workdir")
    parser.add_argument("--scifact-queries", type=Path, help="write SciFact train's held-out adapted query vectors here")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--floor", type=float, default=0.3)
    args = parser.parse_args()
    paths = sorted(glob.glob(f"{args.locomo}/signals-*.npz"))
    groups = [locomo_group(p) for p in paths]
    sf = scifact(args.scifact)
    train, sq, docs, relevant = sf
    every_row = np.arange(len(train))
    out: dict = {}
    # LoCoMo, leave one conversation out; the setting chosen on the other four and all of SciFact train.
    base_convs = [lf.questions(p, args.depth, args.floor) for p in paths]
    every = [q for conv in base_convs for q in conv]
    base = lf.recall_rows(every, ll.held_out(base_convs, 1e-3)[1])
    orders, chosen, dense, adapted_every = [], [], [], []
    for i, path in enumerate(paths):
        others = [p for k, p in enumerate(paths) if k != i]
        pick = choose_locomo(others, [g for k, g in enumerate(groups) if k != i], scifact_group(sq, docs, relevant))
        chosen.append(pick)
        delta = low_rank(fit([g for k, g in enumerate(groups) if k != i] + [scifact_group(sq, docs, relevant)], pick["l2"], pick["tau"]), pick["rank"])
        convs = [lf.questions(p, args.depth, args.floor, adapt=lambda qv: adapt(qv, delta)) for p in paths]
        train_qs = [q for k, conv in enumerate(convs) if k != i for q in conv]
        weights = lf.fit([q[2] for q in train_qs], [q[3] for q in train_qs], 1e-3)
        orders += [lf.learned_order(q, weights) for q in convs[i]]
        dense.append((dense_recall10(np.load(path)["qvec"], path), dense_recall10(adapt(np.load(path)["qvec"], delta), path)))
        print("fold", i, json.dumps(pick), "dense R@10 before/after", dense[-1], flush=True)
        adapted_every += convs[i]
    rng = np.random.default_rng(0)
    rows = lf.recall_rows(adapted_every, orders)
    out["LoCoMo LOCO, shipped recipe"] = {**lf.describe(base), "candidate recall": ll.candidate_recall(every)}
    cat3 = rows[:, 0] == 3
    out["LoCoMo LOCO, adapter"] = {**ll.compare(rows, base, rng), "cat3 R@10 minus baseline": lf.paired(rows[cat3, 2], base[cat3, 2], rng),
                                   "candidate recall": ll.candidate_recall(adapted_every), "chosen per fold": chosen,
                                   "dense-only R@10 per fold (before, after)": dense}
    print(json.dumps(out, indent=1), flush=True)
    # SciFact train, FOLDS-fold: each fold's queries adapted by an adapter that never saw them.
    held = np.zeros_like(sq)
    picks = []
    for f, rows_f in enumerate(np.array_split(every_row, FOLDS)):
        rest = np.setdiff1d(every_row, rows_f)
        pick = choose_scifact(groups, sf, rest)
        picks.append(pick)
        delta = low_rank(fit(groups + [scifact_group(sq[rest], docs, [relevant[r] for r in rest])], pick["l2"], pick["tau"]), pick["rank"])
        held[rows_f] = adapt(sq[rows_f], delta)
        print("scifact fold", f, json.dumps(pick), flush=True)
    out["SciFact train CV"] = {"chosen per fold": picks, "dense nDCG@10 before": round(dense_ndcg10(sq, docs, relevant), 4),
                               "dense nDCG@10 after": round(dense_ndcg10(held, docs, relevant), 4)}
    if args.scifact_queries:
        np.savez(args.scifact_queries, qids=np.array(train), queries=held)
    print(json.dumps(out["SciFact train CV"], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

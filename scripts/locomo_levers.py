"""LoCoMo dev: candidate and diversity levers for the learned fusion, each scored leave-one-conversation-out.

Offline from the signals ``locomo_signals.py`` keeps. A candidate lever changes the BM25 and dense lists a
question fuses (``locomo_fusion.questions(widen=...)``); the fusion's weights are then refitted on four
conversations and scored on the fifth, as ``locomo_fusion.py`` does for the shipped model. A diversity
lever re-orders the top 10 of the held-out learned order by chat session (episode). Every lever is
compared with the shipped recipe held out the same way (paired bootstrap over the 760 questions):

- ``depth D``: the BM25 and dense top D fused instead of the top 100 (``recall_candidates``);
- ``idf P``: BM25 with each query term's share (FTS5 scores an OR query as the sum over its terms)
  multiplied by the term's IDF ** P, i.e. rare words weigh more than BM25's own IDF makes them;
- ``speaker K``: when the question names one speaker, that speaker's top K turns by BM25 and by dense
  similarity join the lists (multi-hop questions are about one person's turns over many sessions);
- ``prf B/M/K``: dense pseudo-relevance feedback (Rocchio): query + B x the mean of the top M dense hits'
  vectors; its top K turns not yet in the dense list join it (K 0: the feedback list replaces it);
- ``interactions``: the fusion's features and every product of two of them (a model of interactions,
  still a linear score), L2 as given;
- ``nested l2`` / ``interactions, nested l2``: L2 chosen inside each fold instead of given: for the held-out
  conversation, every L2 of ``L2_GRID`` is scored leave-one-conversation-out over the other four (mean R@10
  of their held-out questions) and the best is refitted on all four (so the held-out one never chooses);
- ``sessions M`` / ``sessions mean M``: a second stage with one feature more, each candidate's largest cosine to the
  first stage's (the held-out learned order's) top M turns of *other* chat sessions (or its mean cosine to the top M):
  a list question's items ("I made lasagna", "I baked cookies") may resemble each other more than the question;
- ``unnamed`` / ``unnamed feature``: the question embedded once more with the speaker it names left out ("What books
  has read?"; ``--fold-model``: each conversation's model), its vector instead of the question's for every dense signal,
  or its cosine to each candidate minus the best as one feature more (a second stage's: the name pulls the question
  towards every turn of that speaker, not towards the list's items);
- ``gbdt``: a LambdaRank gradient-boosted ranker (LightGBM, not a project dependency: ``pip install lightgbm``) over the
  same features instead of the linear score, its size (leaves x rounds of ``GBDT_GRID``) chosen inside each fold by the
  other four conversations' leave-one-out R@10;
- ``stops``: where an answer of the held-out learned order ends (no lever on the ranking): the gap rule that ships (``gap_cut``: the
  prefix of the top 10 within G of the best learned score) against a length-aware one (every turn whose score minus
  A x ln(characters / 200) is within G of the best, the first 10 of those), as R@10 against the answer's characters;
- ``cap C``: at most C turns of one episode among the first 10, the rest moved down in order;
- ``mmr L``: the first 10 picked greedily by score minus L x (turns of that episode already picked) x the
  standard deviation of the question's scores (MMR over sessions); ``mmr chosen`` picks L on four
  conversations' held-out figures and applies it to the fifth.

    python scripts/locomo_signals.py --workdir /tmp/locomo-sig
    python scripts/locomo_levers.py --workdir /tmp/locomo-sig --json notes/locomo_runs/levers.json
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import sqlite3
from pathlib import Path

import numpy as np

import locomo_fusion as lf
from tinycontext.retrieval import conversation
from tinycontext.retrieval.fusion import gap_cut, match_expression, query_terms

TOP = 10
MMR = (0.1, 0.25, 0.5, 1.0)
L2_GRID = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
GBDT_GRID = tuple((leaves, rounds) for leaves in (3, 7, 15) for rounds in (200, 400))
GBDT_PARAMS = dict(objective="lambdarank", learning_rate=0.03, min_data_in_leaf=200, feature_fraction=0.8, bagging_fraction=0.8,
                   bagging_freq=1, lambdarank_truncation_level=20, verbose=-1, seed=0, num_threads=1, deterministic=True, force_row_wise=True)


def merge(*lists: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Hit lists as one, best first, ties by id (a search's order)."""
    scores: dict[int, float] = {}
    for found in lists:
        scores.update(found)
    return sorted(scores.items(), key=lambda x: (-x[1], x[0]))


def speaker_lists(k: int):
    def widen(c, j, question, info, bm25, dense):
        speaker = conversation.mentioned_speaker(question, {s for _, s in info.values() if s})
        if speaker is None:
            return bm25, dense
        ids = c["ids"]
        mine = np.flatnonzero(np.array([info[int(i)][1] == speaker for i in ids]))
        return (merge(bm25, lf.hits(c["bm25"][j][mine], ids[mine], k, True)),
                merge(dense, lf.hits((c["vectors"] @ c["qvec"][j])[mine], ids[mine], k, False)))
    return widen


def feedback(beta: float, m: int, k: int, depth: int):
    def widen(c, j, question, info, bm25, dense):
        ids, vectors = c["ids"], c["vectors"]
        top = np.searchsorted(ids, [i for i, _ in dense[:m]])
        query = c["qvec"][j] + beta * vectors[top].mean(0)
        shifted = vectors @ (query / np.linalg.norm(query))
        if k == 0:
            return bm25, lf.hits(shifted, ids, depth, False)
        have = {i for i, _ in dense}
        cosine = vectors @ c["qvec"][j]
        new = [i for i, _ in lf.hits(shifted, ids, depth + k, False) if i not in have][:k]
        # A joining turn keeps its own cosine with the query: the dense scores stay comparable.
        return bm25, merge(dense, [(i, float(cosine[np.searchsorted(ids, i)])) for i in new])
    return widen


def term_scores(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per question id: each query term's BM25 over the conversation's turns (terms x turns, as the
    engine scores one term: FTS5 sums these over an OR query) and the term's IDF as FTS5 computes it."""
    c = np.load(path, allow_pickle=False)
    ids = c["ids"]
    db = sqlite3.connect(Path(path).parent / Path(path).name.replace("signals-", "cv-turns-").replace(".npz", ".db"))
    n = db.execute("SELECT count(*) FROM memories_fts").fetchone()[0]
    out = {}
    for qid, question in zip(c["qids"], c["questions"]):
        terms = query_terms(str(question))
        scores = np.zeros((len(terms), len(ids)), np.float32)
        idf = np.zeros(len(terms))
        for t, term in enumerate(terms):
            rows = db.execute("SELECT rowid, -bm25(memories_fts, 1.0, 0.5, 1.0) FROM memories_fts WHERE memories_fts MATCH ?",
                              (match_expression([term]),)).fetchall()
            for rowid, score in rows:
                scores[t, np.searchsorted(ids, rowid)] = score
            idf[t] = max(math.log((n - len(rows) + 0.5) / (len(rows) + 0.5)), 1e-6)
        out[str(qid)] = (scores, idf)
    return out


def idf_weighted(power: float, terms: dict, depth: int):
    """BM25 with each query term's share multiplied by its IDF ** ``power`` (0: the engine's BM25)."""
    def widen(c, j, question, info, bm25, dense):
        scores, idf = terms[str(c["qids"][j])]
        return lf.hits((idf ** power) @ scores if len(idf) else np.zeros(len(c["ids"])), c["ids"], depth, True), dense
    return widen


def deeper(depth: int):
    """The BM25 and dense top ``depth`` instead of the engine's ``recall_candidates``."""
    def widen(c, j, question, info, bm25, dense):
        return lf.hits(c["bm25"][j], c["ids"], depth, True), lf.hits(c["vectors"] @ c["qvec"][j], c["ids"], depth, False)
    return widen


def episodes_of(path: str) -> dict[int, int]:
    c = np.load(path, allow_pickle=False)
    return dict(zip(c["ids"].tolist(), c["episode"].tolist()))


def diversify(q, weights, episode: dict[int, int], *, cap: int = 0, lam: float = 0.0) -> list[int]:
    """The learned order with its first ``TOP`` re-picked by episode (``cap`` or ``mmr``)."""
    scores = q[2] @ weights
    order = np.lexsort((q[1], -scores))
    ids, s = q[1][order].tolist(), scores[order]
    spread = float(s.std()) or 1.0
    chosen: list[int] = []
    used: dict[int, int] = {}
    left = list(range(len(ids)))
    while left and len(chosen) < TOP:
        if cap:
            pick = next((p for p in left if used.get(episode[ids[p]], 0) < cap), None)
            if pick is None:
                break
        else:
            pick = max(left, key=lambda p: (s[p] - lam * spread * used.get(episode[ids[p]], 0), -p))
        left.remove(pick)
        chosen.append(pick)
        used[episode[ids[pick]]] = used.get(episode[ids[pick]], 0) + 1
    return [ids[p] for p in chosen] + [ids[p] for p in left]


def interactions(convs):
    """The same questions with every product of two features added (a linear model of them can weigh,
    e.g., the speaker feature differently in a well-matched episode)."""
    pairs = [(a, b) for a in range(len(conversation.FUSION_FEATURES)) for b in range(a, len(conversation.FUSION_FEATURES))]
    return [[(q[0], q[1], np.hstack([q[2], np.stack([q[2][:, a] * q[2][:, b] for a, b in pairs], 1)]), *q[3:]) for q in conv]
            for conv in convs]


def held_out(convs, l2: float):
    """Per fold the weights fitted on the other conversations, and every question's held-out order."""
    folds, orders = [], []
    for i, conv in enumerate(convs):
        train = [q for k, other in enumerate(convs) if k != i for q in other]
        weights = lf.fit([q[2] for q in train], [q[3] for q in train], l2)
        folds.append(weights)
        orders += [lf.learned_order(q, weights) for q in conv]
    return folds, orders


def nested(convs) -> tuple[list, list[float]]:
    """Every question's held-out order with L2 chosen on the other conversations only, and the L2 per fold."""
    orders, chosen = [], []
    for i, conv in enumerate(convs):
        others = [c for k, c in enumerate(convs) if k != i]
        train = [q for c in others for q in c]
        best = max(L2_GRID, key=lambda l2: lf.recall_rows(train, held_out(others, l2)[1])[:, 2].mean())
        chosen.append(best)
        weights = lf.fit([q[2] for q in train], [q[3] for q in train], best)
        orders += [lf.learned_order(q, weights) for q in conv]
    return orders, chosen


def cross_session(convs, folds, paths, m: int, mean: bool):
    """The questions with a feature more: each candidate's similarity to the top ``m`` of its fold's held-out order
    (``sessions M``/``sessions mean M`` in the module's docstring)."""
    out = []
    for i, conv in enumerate(convs):
        c = np.load(paths[i], allow_pickle=False)
        vectors = dict(zip(c["ids"].tolist(), c["vectors"]))
        episode = episodes_of(paths[i])
        rows = []
        for q in conv:
            top = lf.learned_order(q, folds[i])[:m]
            cos = np.stack([vectors[int(t)] for t in q[1]]) @ np.stack([vectors[t] for t in top]).T
            itself = q[1][:, None] == np.array(top)[None, :]
            if mean:
                feature = np.where(itself, 0.0, cos).sum(1) / np.maximum(1, m - itself.sum(1))
            else:
                other = np.array([episode[int(t)] for t in q[1]])[:, None] != np.array([episode[t] for t in top])[None, :]
                feature = np.where(other & ~itself, cos, -np.inf).max(1)
                feature = np.where(np.isfinite(feature), feature, 0.0)
            rows.append((q[0], q[1], np.hstack([q[2], feature[:, None]]), *q[3:]))
        out.append(rows)
    return out


def unnamed_vectors(path: str, model: str) -> np.ndarray:
    """Each question's unit vector with the speaker it names (and a possessive 's) left out, embedded by ``model`` as
    recall embeds a query; the question's own vector where it names none. Checked against the signals' vectors."""
    from tinycontext.models.embedder import Embedder
    from tinycontext.models.hub import resolve_model

    c = np.load(path, allow_pickle=False)
    embedder = Embedder(resolve_model(model, Path(path).parent / "models"))
    speakers = {str(s) for s in c["speaker"] if str(s)}
    out = np.array(c["qvec"], np.float32)
    for j, question in enumerate(map(str, c["questions"])):
        own = embedder.embed_query(question)
        if float(own @ c["qvec"][j]) / float(np.linalg.norm(own)) < 0.9999:
            raise ValueError(f"{path}: question {j} embedded by {model} differs from the signals' vector (another model?)")
        name = conversation.mentioned_speaker(question, speakers)
        if name is not None:
            vector = embedder.embed_query(" ".join(re.sub(rf"(?<!\w){re.escape(name)}(?:'s)?(?!\w)", " ", question, flags=re.IGNORECASE).split()))
            out[j] = vector / np.linalg.norm(vector)
    return out


def unnamed_feature(convs, paths, unnamed: list[np.ndarray]):
    """The questions with a feature more: each candidate's cosine to the unnamed question minus the best turn's."""
    out = []
    for conv, path, vectors_q in zip(convs, paths, unnamed):
        c = np.load(path, allow_pickle=False)
        position = {int(i): p for p, i in enumerate(c["ids"])}
        cosine = c["vectors"] @ vectors_q.T  # turns x questions
        out.append([(q[0], q[1], np.hstack([q[2], (cosine[[position[int(t)] for t in q[1]], j] - cosine[:, j].max())[:, None]]), *q[3:])
                    for j, q in enumerate(conv)])
    return out


def gbdt_orders(convs) -> tuple[list, list[dict]]:
    """Every question's held-out order by a LambdaRank GBDT whose size is chosen on the other conversations only."""
    import lightgbm as lgb

    def fit(train, setting):
        train = [q for q in train if q[3].any()]
        data = lgb.Dataset(np.vstack([q[2] for q in train]), np.concatenate([q[3] for q in train]).astype(int), group=[len(q[1]) for q in train])
        return lgb.train({**GBDT_PARAMS, "num_leaves": setting[0]}, data, num_boost_round=setting[1])

    def order(model, q):
        return q[1][np.lexsort((q[1], -model.predict(q[2])))].tolist()

    def inner(others, setting):
        got = []
        for j, held in enumerate(others):  # one fit per conversation held out of the four
            model = fit([q for k, c in enumerate(others) if k != j for q in c], setting)
            got += [order(model, q) for q in held]
        return float(lf.recall_rows([q for c in others for q in c], got)[:, 2].mean())

    orders, chosen = [], []
    for i, conv in enumerate(convs):
        others = [c for k, c in enumerate(convs) if k != i]
        scores = {setting: inner(others, setting) for setting in GBDT_GRID}
        best = max(GBDT_GRID, key=scores.get)
        chosen.append({"leaves, rounds": best, "inner R@10": {str(k): round(v, 4) for k, v in scores.items()}})
        model = fit([q for c in others for q in c], best)
        orders += [order(model, q) for q in conv]
    return orders, chosen


def stop_rules(convs, folds) -> list[dict]:
    """R@10 and characters of answers of the held-out learned order ended by the gap rule or the length-aware one."""
    items = []
    for i, conv in enumerate(convs):
        for q in conv:
            scores = q[2] @ folds[i]
            o = np.lexsort((q[1], -scores))
            items.append((scores[o], np.array([q[7][int(t)] for t in q[1][o]], float), np.array([int(t) in q[6] for t in q[1][o]]), q[4], q[0]))
    cats = np.array([it[4] for it in items])

    def row(rule, g, a, keep):
        kept = [keep(s, chars)[:TOP] for s, chars, _, _, _ in items]
        recall = np.array([ev[k].sum() / total for (_, _, ev, total, _), k in zip(items, kept)])
        return {"rule": rule, "G": g, "A": a, "R@10": round(float(recall.mean()), 4), "cat1 R@10": round(float(recall[cats == 1].mean()), 4),
                "characters": round(float(np.mean([chars[k].sum() for (_, chars, _, _, _), k in zip(items, kept)])), 1),
                "turns": round(float(np.mean([len(k) for k in kept])), 2)}
    out = [row("gap", g, 0.0, lambda s, chars, g=g: np.arange(gap_cut(np.exp(s - s[0]).tolist(), g))) for g in np.arange(3.0, 7.01, 0.25)]
    for a in (0.5, 1.0, 1.5, 2.0):
        out += [row("length-aware", g, a, lambda s, chars, g=g, a=a: np.unique(np.r_[0, np.flatnonzero(s - s[0] - a * np.log(chars / 200.0) >= -g)]))
                for g in np.arange(2.0, 9.01, 0.25)]
    return out


def candidate_recall(every) -> dict:
    pool = np.array([(q[0], q[3].sum() / q[4]) for q in every])
    return {"all": round(float(pool[:, 1].mean()), 4), **{f"cat{c}": round(float(pool[pool[:, 0] == c, 1].mean()), 4) for c in lf.CATEGORIES},
            "mean_pool": round(float(np.mean([len(q[1]) for q in every])), 1)}


def compare(rows: np.ndarray, base: np.ndarray, rng) -> dict:
    cat1 = rows[:, 0] == 1
    return {**lf.describe(rows), "R@10 minus baseline": lf.paired(rows[:, 2], base[:, 2], rng),
            "R@5 minus baseline": lf.paired(rows[:, 1], base[:, 1], rng),
            "cat1 R@10 minus baseline": lf.paired(rows[cat1, 2], base[cat1, 2], rng),
            "top-10 characters minus baseline": lf.paired(rows[:, 4], base[:, 4], rng)}


def main() -> None:
    parser = lf.signal_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--only", nargs="*", help="only these levers (names as printed; default: all)")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--fold-model", nargs="*", default=[], metavar="CONV=MODEL",
                        help="the unnamed levers: each conversation's embedding model (as locomo_signals.py was given it)")
    args = parser.parse_args()
    paths = sorted(glob.glob(f"{args.workdir}/signals-*.npz"))
    wanted = (lambda name: args.only is None or name in args.only)
    candidates = {  # name -> the lists' widening, built only when run
        "idf 0.5": lambda terms: idf_weighted(0.5, terms, args.depth), "idf 1": lambda terms: idf_weighted(1.0, terms, args.depth),
        "depth 150": lambda _: deeper(150), "depth 200": lambda _: deeper(200),
        "speaker 20": lambda _: speaker_lists(20), "speaker 50": lambda _: speaker_lists(50),
        "prf 0.5/5/0": lambda _: feedback(0.5, 5, 0, args.depth), "prf 1/5/0": lambda _: feedback(1.0, 5, 0, args.depth),
        "prf 0.5/5/20": lambda _: feedback(0.5, 5, 20, args.depth), "prf 1/10/50": lambda _: feedback(1.0, 10, 50, args.depth),
    }
    diversity = {**{f"cap {c}": {"cap": c} for c in (2, 3, 4)}, **{f"mmr {lam}": {"lam": lam} for lam in MMR}}
    terms = {}
    if any(wanted(name) for name in candidates if name.startswith("idf")):
        terms = {k: v for p in paths for k, v in term_scores(p).items()}
        # The weighting starts from what ships only if the per-term scores sum to the engine's BM25.
        gap = max(float(np.abs(terms[str(q)][0].sum(0) - row).max()) for p in paths for c in [np.load(p)] for q, row in zip(c["qids"], c["bm25"]))
        print("per-term BM25 sums vs the engine's BM25, max abs difference:", gap, flush=True)
    base_convs = [lf.questions(p, args.depth, args.floor) for p in paths]
    every = [q for conv in base_convs for q in conv]
    folds, base_orders = held_out(base_convs, args.l2)
    base = lf.recall_rows(every, base_orders)
    rng = np.random.default_rng(0)
    out: dict = {"questions": len(every), "baseline (shipped recipe, LOCO-CV)": {**lf.describe(base), "candidate recall": candidate_recall(every)}}
    print(json.dumps(out, indent=1), flush=True)
    for name, make in candidates.items():
        if wanted(name):
            convs = [lf.questions(p, args.depth, args.floor, make(terms)) for p in paths]
            qs = [q for conv in convs for q in conv]
            out[name] = {**compare(lf.recall_rows(qs, held_out(convs, args.l2)[1]), base, rng), "candidate recall": candidate_recall(qs)}
            print(name, json.dumps(out[name]), flush=True)
    for l2 in (1e-3, 1e-2):
        name = f"interactions, l2 {l2}"
        if wanted(name):
            convs = interactions(base_convs)
            out[name] = compare(lf.recall_rows(every, held_out(convs, l2)[1]), base, rng)
            print(name, json.dumps(out[name]), flush=True)
    for name, make in (("nested l2", lambda: base_convs), ("interactions, nested l2", lambda: interactions(base_convs))):
        if wanted(name):
            orders, chosen = nested(make())
            out[name] = {**compare(lf.recall_rows(every, orders), base, rng), "l2 per fold": chosen}
            print(name, json.dumps(out[name]), flush=True)
    for m in (3, 5, 10):
        for name, mean in ((f"sessions {m}", False), (f"sessions mean {m}", True)):
            if wanted(name):
                out[name] = compare(lf.recall_rows(every, held_out(cross_session(base_convs, folds, paths, m, mean), args.l2)[1]), base, rng)
                print(name, json.dumps(out[name]), flush=True)
    if wanted("unnamed") or wanted("unnamed feature"):
        models = dict(item.split("=", 1) for item in args.fold_model)
        unnamed = [unnamed_vectors(p, models.get(Path(p).stem.removeprefix("signals-"), "fast")) for p in paths]
        if wanted("unnamed"):
            convs = [lf.questions(p, args.depth, args.floor, adapt=lambda _, u=u: u) for p, u in zip(paths, unnamed)]
            qs = [q for conv in convs for q in conv]
            out["unnamed"] = {**compare(lf.recall_rows(qs, held_out(convs, args.l2)[1]), base, rng), "candidate recall": candidate_recall(qs)}
            print("unnamed", json.dumps(out["unnamed"]), flush=True)
        if wanted("unnamed feature"):
            out["unnamed feature"] = compare(lf.recall_rows(every, held_out(unnamed_feature(base_convs, paths, unnamed), args.l2)[1]), base, rng)
            print("unnamed feature", json.dumps(out["unnamed feature"]), flush=True)
    if wanted("gbdt"):
        orders, chosen = gbdt_orders(base_convs)
        out["gbdt"] = {**compare(lf.recall_rows(every, orders), base, rng), "chosen per fold": chosen}
        print("gbdt", json.dumps(out["gbdt"]), flush=True)
    if wanted("stops"):
        out["stops"] = stop_rules(base_convs, folds)
        for row in out["stops"]:
            print("stops", json.dumps(row), flush=True)
    # Diversity: each question's first 10 of its fold's held-out order, re-picked.
    picked = {}
    for name, knobs in diversity.items():
        if wanted(name) or (wanted("mmr chosen") and "lam" in knobs):
            orders = [diversify(q, folds[i], episodes_of(paths[i]), **knobs) for i, conv in enumerate(base_convs) for q in conv]
            picked[name] = lf.recall_rows(every, orders)
            out[name] = compare(picked[name], base, rng)
            print(name, json.dumps(out[name]), flush=True)
    if wanted("mmr chosen"):
        # MMR's weight chosen on the other four conversations (mean R@10 of their held-out questions).
        conv_of = np.array([i for i, conv in enumerate(base_convs) for _ in conv])
        chosen_rows, choices = np.zeros_like(base), []
        for i in range(len(base_convs)):
            others = conv_of != i
            best = max(MMR, key=lambda lam: picked[f"mmr {lam}"][others, 2].mean())
            choices.append(best)
            chosen_rows[~others] = picked[f"mmr {best}"][~others]
        out["mmr chosen"] = {**compare(chosen_rows, base, rng), "chosen per fold": choices}
        print("mmr chosen", json.dumps(out["mmr chosen"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

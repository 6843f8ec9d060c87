"""SciFact, offline: long documents (field-aware BM25, dense scores over a document's passages), tuned on
train, checked on test, from signals computed once.

Signals: BM25 through the engine (a keyword-only database built here, the harness's document text
``title\\ntext``: ``MemoryEngine.search``), and, with the real model through the harness's embedding cache
(``evals.embedding_cache.CachedEmbedder``, so vectors are shared with ``python -m evals.run``), each
document's vector as the engine stores it (its first ``max_tokens`` tokens) and one vector per further
passage of a document longer than that (token windows that start at a word, ``--stride`` apart).
Field-aware BM25: an FTS5 table with title and body columns (the engine's tokenizer and query
expression), ``bm25(t, title_weight, 1)``.

Rankings: the engine's own ``fuse`` (weighted RRF), ``relevance_floor`` and ``score_fusion`` (what ships
for memories that are not turns) over BM25 top-100 and dense top-100, where a document's dense score is
its first vector's (what ships), the max over its passages, or the mean of its passage vectors; a BM25
hit outside the dense list may get its own cosine ("exact cosines": the engine holds the stored
vectors). nDCG@10 of the ranking (ir_measures), paired bootstrap CIs against what ships.

    python scripts/scifact_passages.py --workdir /tmp/scifact-pass --json notes/eval_runs/scifact_passages.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import ir_measures
import numpy as np
from ir_measures import Qrel, ScoredDoc, nDCG

from evals.datasets import load_beir
from evals.embedding_cache import CachedEmbedder
from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.models.embedder import Embedder, _load_tokenizer
from tinycontext.models.hub import resolve_model
from tinycontext.retrieval.fusion import SCORE_FUSION_DENSE_SHARE, fts_query, fuse, relevance_floor, score_fusion

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "datasets" / "scifact"
DEPTH = 100
SHIPS = "ships (score fusion, first window, flat BM25)"
ADAPTED = "ships, --queries vectors"


def passages(tokenizer, text: str, window: int, stride: int) -> list[str]:
    """``text`` cut into pieces of at most ``window`` tokens, each starting at a word (not a ``##``
    piece) about ``stride`` tokens after the previous one; the first is what truncation embeds."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    tokens, offsets = enc.tokens, enc.offsets
    if len(tokens) <= window:
        return [text]
    out, start = [], 0
    while True:
        end = min(start + window, len(tokens))
        out.append(text[offsets[start][0]:offsets[end - 1][1]])
        if end == len(tokens):
            return out
        nxt = start + stride
        while nxt > start + 1 and tokens[nxt].startswith("##"):
            nxt -= 1
        start = nxt


def ndcg_per_query(qrels: dict, run: dict[str, list[str]]) -> dict[str, float]:
    q = [Qrel(qid, doc, rel) for qid, docs in qrels.items() for doc, rel in docs.items()]
    r = [ScoredDoc(qid, doc, -float(rank)) for qid, docs in run.items() for rank, doc in enumerate(docs)]
    out = {qid: 0.0 for qid in run}
    for m in ir_measures.iter_calc([nDCG @ 10], q, r):
        out[m.query_id] = m.value
    return out


def paired_ci(a: np.ndarray, b: np.ndarray, rng, n: int = 10_000) -> tuple[float, float, float]:
    d = b - a
    means = d[rng.integers(0, len(d), (n, len(d)))].mean(1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=REPO / ".eval_cache", help="the harness's cache_dir (vectors shared)")
    parser.add_argument("--stride", type=int, default=192)
    parser.add_argument("--title-prefix", action="store_true", help="each further passage starts with the document's first line (its title)")
    parser.add_argument("--report", nargs="*", default=[SHIPS], help="configs also scored on test")
    parser.add_argument("--only", nargs="*", help="only these configs (names as printed; default: all)")
    parser.add_argument("--queries", type=Path, help="an .npz of qids and query vectors (fit_query_adapter.py's held-out "
                        "adapted vectors): adds ADAPTED, what ships with these vectors instead, scored on train only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = load_beir(SCIFACT)
    docs = data.docs
    doc_ids = [d.id for d in docs]
    bundle = resolve_model("fast", args.workdir / "models")
    embedder = CachedEmbedder(Embedder(bundle), args.cache)
    tokenizer = _load_tokenizer(bundle)[0]
    window = bundle.max_tokens - 2  # [CLS] and [SEP]

    signals = args.workdir / f"signals-{args.stride}{'-title' if args.title_prefix else ''}.npz"
    splits = {s: data.split_ids(s) for s in ("train", "test")}
    qids = splits["train"] + splits["test"]
    if not signals.exists():
        pieces = [passages(tokenizer, d.text, window, args.stride) for d in docs]
        owner = np.repeat(np.arange(len(docs)), [len(p) for p in pieces])
        first = embedder.embed_documents([d.text for d in docs], progress=True)
        rest = [(d.text.split("\n", 1)[0] + "\n" if args.title_prefix else "") + p for d, ps in zip(docs, pieces) for p in ps[1:]]
        print(len(rest), "further passages", flush=True)
        later = embedder.embed_documents(rest, progress=True) if rest else np.zeros((0, first.shape[1]), np.float32)
        vectors = np.empty((len(owner), first.shape[1]), np.float32)
        is_first = np.r_[True, owner[1:] != owner[:-1]]
        vectors[is_first], vectors[~is_first] = first, later
        queries = np.stack([embedder.embed_query(data.queries[q]) for q in qids])
        np.savez(signals, vectors=vectors, owner=owner, is_first=is_first, queries=queries)
    z = np.load(signals)
    vectors, owner, is_first, queries = z["vectors"], z["owner"], z["is_first"], z["queries"]
    adapted = queries.copy()
    if args.queries:
        given = np.load(args.queries)
        adapted[[qids.index(str(q)) for q in given["qids"]]] = given["queries"]

    # BM25 as the engine computes it (keyword-only database of the same documents).
    db = args.workdir / "keyword.db"
    engine = MemoryEngine(TinyContextConfig(memory_db_path=db, models_dir=args.workdir / "models", embedding_backend="none"))
    if not engine.store.read("SELECT count(*) FROM memories")[0][0]:
        for i in range(0, len(docs), 500):
            engine.save([{"content": d.text, "metadata": {"doc_id": d.id}} for d in docs[i:i + 500]], session_id="corpus")
    mem_to_doc = {r[0]: json.loads(r[1])["doc_id"] for r in engine.store.read("SELECT id, metadata FROM memories")}
    doc_pos = {d: i for i, d in enumerate(doc_ids)}
    bm25 = {q: [(doc_pos[mem_to_doc[m]], s) for m, s in engine.search(data.queries[q], candidates=DEPTH).bm25] for q in qids}

    # Field-aware BM25: title and body columns.
    fdb = sqlite3.connect(args.workdir / "fields.db")
    if not fdb.execute("SELECT count(*) FROM sqlite_master WHERE name = 'f'").fetchone()[0]:
        corpus = {json.loads(line)["_id"]: json.loads(line) for line in (SCIFACT / "corpus.jsonl").open()}
        fdb.execute("CREATE VIRTUAL TABLE f USING fts5(title, body, tokenize='porter unicode61 remove_diacritics 2')")
        fdb.executemany("INSERT INTO f(rowid, title, body) VALUES (?, ?, ?)",
                        [(i + 1, corpus[d]["title"] or "", corpus[d]["text"] or "") for i, d in enumerate(doc_ids)])
        fdb.commit()

    def field_bm25(q: str, title_weight: float) -> list[tuple[int, float]]:
        match = fts_query(q)
        if match is None:
            return []
        rows = fdb.execute("SELECT rowid - 1, -bm25(f, ?, 1.0) AS s FROM f WHERE f MATCH ? ORDER BY s DESC, rowid LIMIT ?",
                           (title_weight, match, DEPTH)).fetchall()
        return [(r[0], r[1]) for r in rows]

    mean_vec = np.zeros((len(docs), vectors.shape[1]), np.float32)
    np.add.at(mean_vec, owner, vectors)
    mean_vec /= np.linalg.norm(mean_vec, axis=1, keepdims=True)
    first_vec = vectors[is_first]

    def dense(j: int, how: str, query: np.ndarray) -> list[tuple[int, float]]:
        if how == "first":
            score = first_vec @ query
        elif how == "mean":
            score = mean_vec @ query
        else:
            sims = vectors @ query
            score = np.full(len(docs), -2.0, np.float32)
            np.maximum.at(score, owner, sims)
            if how.startswith("blend"):  # blend:a = a * max + (1 - a) * first
                a = float(how.split(":")[1])
                score = a * score + (1 - a) * (first_vec @ query)
        top = np.argsort(-score, kind="stable")[:DEPTH]
        return [(int(i), float(score[i])) for i in top]

    def run(split: str, how: str, *, weight: float = 0.5, k: float = 10, title_weight: float | None = None,
            share: float | None = None, exact: bool = False, vectors_of: np.ndarray = queries) -> dict[str, float]:
        """nDCG@10 per query; ``share``: score fusion with that dense share (else weighted RRF); ``exact``:
        a BM25 hit outside the dense list gets its own cosine (the stored vector), not none; ``vectors_of``:
        the query vectors (row per qid)."""
        out = {}
        for q in splits[split]:
            j = qids.index(q)
            lexical = bm25[q] if title_weight is None else field_bm25(data.queries[q], title_weight)
            semantic = dense(j, how, vectors_of[j]) if weight > 0 else []
            ranked, _ = relevance_floor(fuse(lexical, semantic, dense_weight=weight, k=k), 0.3)
            if exact:
                cosine = first_vec @ vectors_of[j]
                for c in ranked:
                    c.dense = float(cosine[c.id]) if c.dense is None else c.dense
            if share is not None:
                ranked = score_fusion(ranked, semantic, dense_share=share)
            out[q] = [doc_ids[c.id] for c in ranked[:10]]
        return ndcg_per_query({q: data.qrels[q] for q in splits[split]}, out)

    rng = np.random.default_rng(0)
    results: dict = {"stride": args.stride, "title_prefix": args.title_prefix, "window": window, "docs_longer": len(set(owner[~is_first].tolist())),
                     "further_passages": int((~is_first).sum())}
    configs = {SHIPS: dict(how="first", share=SCORE_FUSION_DENSE_SHARE), "weighted RRF (before score fusion)": dict(how="first")}
    if args.queries:
        configs[ADAPTED] = dict(how="first", share=SCORE_FUSION_DENSE_SHARE, vectors_of=adapted)
        configs[ADAPTED + ", dense only"] = dict(how="first", weight=1.0, vectors_of=adapted)
    # Score fusion with exact cosines for BM25 hits outside the dense list, and with a title column.
    for share in (0.25, 0.35, 0.45):
        configs[f"score fusion {share}, exact cosines"] = dict(how="first", share=share, exact=True)
    for how in ("max", "blend:0.5", "blend:0.25"):
        configs[f"score fusion, dense {how}"] = dict(how=how, share=SCORE_FUSION_DENSE_SHARE)
    for tw in (2.0, 3.0):
        configs[f"score fusion, title weight {tw}"] = dict(how="first", share=SCORE_FUSION_DENSE_SHARE, title_weight=tw)
        configs[f"score fusion, exact cosines, title weight {tw}"] = dict(how="first", share=SCORE_FUSION_DENSE_SHARE, exact=True, title_weight=tw)
    for how in ("max", "mean", "blend:0.5"):
        configs[f"dense {how}"] = dict(how=how)
    for tw in (0.5, 1.0, 2.0, 3.0, 4.0):
        configs[f"title weight {tw}"] = dict(how="first", title_weight=tw)
    for how in ("max", "blend:0.5"):
        configs[f"title weight 3.0, dense {how}"] = dict(how=how, title_weight=3.0)
    configs["BM25 only, flat"] = dict(how="first", weight=0.0)
    for tw in (1.0, 2.0):
        configs[f"BM25 only, title weight {tw}"] = dict(how="first", weight=0.0, title_weight=tw)
    configs["dense only, first"] = dict(how="first", weight=1.0)
    configs["dense only, max"] = dict(how="max", weight=1.0)
    configs["dense only, mean"] = dict(how="mean", weight=1.0)
    base = {s: run(s, **configs[SHIPS]) for s in ("train", "test")}
    for name, cfg in configs.items():
        if args.only is not None and name not in args.only and name != SHIPS:
            continue
        row = {}
        # Choices are made on train: test is scored only for the configs named with --report.
        for s in ("train", "test") if name in args.report else ("train",):
            got = run(s, **cfg)
            a = np.array([base[s][q] for q in splits[s]])
            b = np.array([got[q] for q in splits[s]])
            row[s] = {"ndcg10": float(b.mean()), "vs_ships": paired_ci(a, b, rng)}
        results[name] = row
        print(f"{name:40s} " + "  ".join(f"{s} {v['ndcg10']:.4f} ({v['vs_ships'][0]:+.4f} [{v['vs_ships'][1]:+.4f}, {v['vs_ships'][2]:+.4f}])"
                                          for s, v in row.items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

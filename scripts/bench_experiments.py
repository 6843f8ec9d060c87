"""Throwaway experiments behind notes/bench_engine.md (not part of the benchmark); engine changes
are monkeypatched here, never edited in tinycontext/. Subcommands (run from scripts/):
  profile N      split recall cost (embed / bm25 / dense) at N memories
  locomo         dense_weight / rrf_k / candidates / stopword grid per memory format
  locomo2        rrf_k sweep, dated formats, "previous turn" context embedding
  scifact        tuning grid on SciFact train qrels (needs the index in /tmp/bx/main)
  scifact_test   the setting picked on train, once on test
"""
from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import bench_engine as be
import bench_locomo

WORK = Path("/tmp/bx")


def timed(fn, *a, **k):
    t = time.perf_counter()
    fn(*a, **k)
    return (time.perf_counter() - t) * 1000


def profile(n: int) -> None:
    WORK.mkdir(exist_ok=True)
    rng = random.Random(7)
    convs = bench_locomo.load()
    pool = be.real_pool(convs)
    rng.shuffle(pool)
    pool = pool[:1500]
    qs = [q["question"] for c in convs for q in c["qa"]]
    rng.shuffle(qs)
    db = WORK / f"prof-{n}.db"
    db.unlink(missing_ok=True)
    with be.new_engine(db) as e:
        vecs = e.embedder.embed_documents(pool)
        be.fill_session(e, "big", n, pool, vecs, rng)
        e.recall("warm", session_id="big")
        res = {"embed": [], "bm25": [], "dense_cached": [], "rows": []}
        for q in qs[:40]:
            res["embed"].append(timed(e.embedder.embed_query, q))
            res["bm25"].append(timed(e._bm25, q, "big", [], 100))
            res["dense_cached"].append(timed(e._dense, q, "big", [], 100))
        from tinycontext.retrieval import fts_query
        print("fts", fts_query(qs[0]))
        for k, v in res.items():
            if v:
                print(f"{n} {k}: p50 {statistics.median(v):.1f} ms")



STOP = set("""a an and are as at be been being but by can could did do does doing for from had has have having he her
hers him his how i if in into is it its me my of on or our she so than that the their them then there these they this
those to too was we were what when where which who whom why will with would you your yours""".split())


def stopword_fts(text):
    """fts_query without English stopwords (falls back to all words if only stopwords)."""
    from tinycontext import retrieval
    words = [w for w in retrieval._WORD.findall(text) if w.lower() not in STOP]
    return retrieval.fts_query(" ".join(words)) or retrieval.fts_query(text)


def patch(variant: str) -> None:
    import tinycontext.engine as eng
    from tinycontext import retrieval
    eng.fts_query = stopword_fts if "stop" in variant else retrieval.fts_query


def locomo_dbs(fmt: str):
    convs = bench_locomo.load()
    out = []
    for conv in convs:
        db = WORK / f"loc-{fmt}-{conv['sample_id']}.db"
        mp = db.with_suffix(".json")
        if not db.exists() or not mp.exists():
            db.unlink(missing_ok=True)
            with be.new_engine(db) as e:
                m, _, _ = be.ingest_locomo(e, conv, fmt)
            mp.write_text(__import__("json").dumps(m))
        out.append((conv, db, __import__("json").loads(mp.read_text())))
    return out


def locomo(*_):
    grid = [dict(dense_weight=w, rrf_k=60) for w in (0.0, 0.3, 0.5, 0.7, 1.0)]
    grid += [dict(dense_weight=0.5, rrf_k=10), dict(dense_weight=0.5, rrf_k=60, candidates=300)]
    for fmt in ("plain", "dated", "dated_caption"):
        dbs = locomo_dbs(fmt)
        engines = [be.new_engine(db) for _, db, _ in dbs]  # one per conversation: query vectors stay cached
        runs = [("base", k) for k in grid] + [("stop", dict(dense_weight=w, rrf_k=60)) for w in (0.0, 0.3, 0.5)]
        for variant, knobs in runs:
            patch(variant)
            qrels, run = [], []
            for (conv, db, m), e in zip(dbs, engines):
                qrels += bench_locomo.qrels_for(conv, m)
                run += be.recall_run(e, conv, **knobs)[0]
            s = be.scores(qrels, run)
            print(f"{fmt:14s} {variant:5s} {knobs}  R@10 {s['R@10']:.3f} R@5 {s['R@5']:.3f} nDCG@10 {s['nDCG@10']:.3f} MRR@10 {s['RR@10']:.3f}", flush=True)
        for e in engines:
            e.close()


def scifact(*_):
    """Tune on train qrels with the index built by bench_engine.py --workdir /tmp/bx/main."""
    import json
    db = Path("/tmp/bx/main/scifact.db")
    id_to_doc = json.loads(Path("/tmp/bx/main/scifact-ids.json").read_text())
    _, queries, qrels = be.load_scifact("train")
    runs = [("base", dict(dense_weight=w, rrf_k=k)) for w in (0.5, 0.3, 0.7) for k in (60, 10)]
    runs += [("stop", dict(dense_weight=w, rrf_k=k)) for w, k in ((0.0, 60), (0.5, 60), (0.5, 10))]
    with be.new_engine(db) as e:
        for variant, knobs in runs:
            patch(variant)
            print(f"train {variant:5s} {knobs} nDCG@10 {be.scifact_ndcg(e, id_to_doc, queries, qrels, **knobs):.4f}", flush=True)



class ContextEmbedder:
    """Wraps the real embedder: a document is embedded together with the turn before it
    (stored content and BM25 text stay the turn alone)."""

    def __init__(self, inner, context: dict[str, str]):
        self.inner, self.context = inner, context

    def embed_documents(self, texts, progress=False):
        return self.inner.embed_documents([self.context.get(t, t) for t in texts], progress=progress)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def locomo2(*_):
    import json
    plain_k = [("base", dict(dense_weight=w, rrf_k=k)) for w in (0.3, 0.5) for k in (5, 10, 20, 30)]
    plain_k += [("stop", dict(dense_weight=w, rrf_k=10)) for w in (0.3, 0.5)]
    few = [("base", dict(dense_weight=0.5, rrf_k=60)), ("base", dict(dense_weight=0.5, rrf_k=10)),
           ("base", dict(dense_weight=0.3, rrf_k=10)), ("stop", dict(dense_weight=0.5, rrf_k=10))]
    for fmt, runs in (("plain", plain_k), ("dated", few), ("dated_caption", few), ("plain+prev", few[:3])):
        if fmt == "plain+prev":
            dbs = []
            for conv in bench_locomo.load():
                db = WORK / f"loc-prev-{conv['sample_id']}.db"
                mp = db.with_suffix(".json")
                if not mp.exists():
                    db.unlink(missing_ok=True)
                    chats = bench_locomo.sessions(conv, "plain")
                    flat = [t for chat in chats for _, t in chat]
                    ctx = {t: (flat[i - 1] + "\n" + t if i else t) for i, t in enumerate(flat)}
                    with be.new_engine(db) as e:
                        e.embedder = ContextEmbedder(e.embedder, ctx)
                        m, _, _ = be.ingest_locomo(e, conv, "plain")
                    mp.write_text(json.dumps(m))
                dbs.append((conv, db, json.loads(mp.read_text())))
        else:
            dbs = locomo_dbs(fmt)
        engines = [be.new_engine(db) for _, db, _ in dbs]
        for variant, knobs in runs:
            patch(variant)
            qrels, run = [], []
            for (conv, db, m), e in zip(dbs, engines):
                qrels += bench_locomo.qrels_for(conv, m)
                run += be.recall_run(e, conv, **knobs)[0]
            s = be.scores(qrels, run)
            print(f"{fmt:14s} {variant:5s} {knobs}  R@10 {s['R@10']:.3f} R@5 {s['R@5']:.3f} nDCG@10 {s['nDCG@10']:.3f} MRR@10 {s['RR@10']:.3f}", flush=True)
        for e in engines:
            e.close()



def scifact_test(*_):
    """Test nDCG@10 for the settings picked on train (rrf_k=10), once, for the report."""
    import json
    db = Path("/tmp/bx/main/scifact.db")
    id_to_doc = json.loads(Path("/tmp/bx/main/scifact-ids.json").read_text())
    _, queries, qrels = be.load_scifact("test")
    with be.new_engine(db) as e:
        for variant, knobs in (("base", dict(dense_weight=0.5, rrf_k=10)), ("stop", dict(dense_weight=0.5, rrf_k=10)),
                               ("stop", dict(dense_weight=0.0, rrf_k=60))):
            patch(variant)
            print(f"test {variant:5s} {knobs} nDCG@10 {be.scifact_ndcg(e, id_to_doc, queries, qrels, **knobs):.4f}", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*[int(a) for a in sys.argv[2:]])

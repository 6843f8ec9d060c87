"""LoCoMo dev: every ranking signal of every question, computed once through the engine and kept
as one .npz per conversation, so fusion and candidate levers can be tried offline in numpy.

Per conversation (the README recipe: one save call per chat session, a turn per memory):
turn ids, episode ids, speakers, unit vectors; per question: the query vector, BM25 of every
matching turn (``MemoryEngine.search`` as deep as the conversation), BM25 of every matching
episode (``conversation.episode_bm25``), the engine's default top-100 ranking (to check an
offline model reproduces it), evidence ids and category.

    python scripts/locomo_signals.py --workdir /tmp/locomo-sig

Signals of conversations no model has seen, for the leave-one-conversation-out check of a fine-tuned
model: each conversation embedded by its fold's model (trained without it; ``finetune_minilm.py``):

    python scripts/locomo_signals.py --workdir /tmp/locomo-sig-loco --fold-model conv-26=/tmp/s_conv-26/bundle ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import bench_locomo
from bench_locomo_cv import evidence, open_conversation
from tinycontext.retrieval import conversation


def extract(work: Path, conv: dict, model: str = "fast") -> Path:
    out = work / f"signals-{conv['sample_id']}.npz"
    engine, dia_to_id = open_conversation(work, conv, "turns", reuse=True, embedding_model=model)
    sid = conv["sample_id"]
    with engine:
        rows = engine.store.read("SELECT id, episode_id, coalesce(speaker, ''), occurred_at, content FROM memories WHERE session_id = ? ORDER BY id", (sid,))
        ids = np.array([r[0] for r in rows], np.int64)
        vec = {r[0]: np.frombuffer(r[1], np.float32) for r in engine.store.read(
            "SELECT memory_id, embedding FROM memory_vectors WHERE session_id = ?", (sid,))}
        vectors = np.stack([vec[i] for i in ids])
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        pos = {int(i): p for p, i in enumerate(ids)}
        qs = bench_locomo.questions(conv)
        ev = evidence(conv, dia_to_id)
        n = len(ids)
        bm25 = np.zeros((len(qs), n), np.float32)  # 0: no match
        ep_ids = sorted({r[1] for r in rows})
        ep_pos = {e: p for p, e in enumerate(ep_ids)}
        ep_bm25 = np.zeros((len(qs), len(ep_ids)), np.float32)
        qvec = np.zeros((len(qs), vectors.shape[1]), np.float32)
        default_top = np.full((len(qs), 100), -1, np.int64)
        evid = np.zeros((len(qs), n), bool)
        missing = np.zeros(len(qs), np.int64)
        cats = np.array([q["category"] for q in qs])
        for j, q in enumerate(qs):
            signals = engine.search(q["question"], session_id=sid, candidates=n)
            for mid, score in signals.bm25:
                bm25[j, pos[mid]] = score
            for eid, score in conversation.episode_bm25(engine.store, q["question"], sid, "porter", depth=len(ep_ids)):
                ep_bm25[j, ep_pos[eid]] = score
            qvec[j] = engine.embedder.embed_query(q["question"])
            got = engine.recall(q["question"], session_id=sid, top_k=100, max_tokens=1_000_000, score_cliff=0.0)["memories"]
            default_top[j, :len(got)] = [m["id"] for m in got]
            for mid in ev[q["qid"]][1]:
                if mid.isdigit():
                    evid[j, pos[int(mid)]] = True
                else:
                    missing[j] += 1
        qvec /= np.linalg.norm(qvec, axis=1, keepdims=True)
        np.savez_compressed(out, ids=ids, episode=np.array([r[1] for r in rows]), speaker=np.array([r[2] for r in rows]),
                            occurred=np.array([r[3] or "" for r in rows]), content=np.array([r[4] for r in rows]),
                            vectors=vectors, ep_ids=np.array(ep_ids), bm25=bm25, ep_bm25=ep_bm25, qvec=qvec,
                            default_top=default_top, evid=evid, missing=missing, cats=cats,
                            questions=np.array([q["question"] for q in qs]), qids=np.array([q["qid"] for q in qs]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="databases are kept (and reused) here: one model per folder")
    parser.add_argument("--model", default="fast", help="embedding_model of every conversation (default: fast)")
    parser.add_argument("--fold-model", nargs="+", default=[], metavar="CONV=MODEL",
                        help="this conversation's embedding_model instead (its fold's model); with any, only the conversations named")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    folds = dict(item.split("=", 1) for item in args.fold_model)
    for conv in bench_locomo.load():
        if not folds or conv["sample_id"] in folds:
            print(extract(args.workdir, conv, folds.get(conv["sample_id"], args.model)), flush=True)


if __name__ == "__main__":
    main()

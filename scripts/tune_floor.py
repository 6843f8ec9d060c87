"""Tune the relevance floor: tokens returned vs recall on LoCoMo dev and SciFact train.

Two rules (tinycontext/retrieval/fusion.py): the floor (``recall_min_dense``) drops candidates with no
lexical match and a weak dense similarity; the score cliff (``recall_score_cliff``) ends the answer
where every memory left is clearly weaker than the best ranked above it. Every question is recalled once per
floor with the cliff off and every ranked candidate returned (top_k = recall_candidates); each cliff
setting is then applied to that ranked list with the engine's own function, ``cliff_cut``, and the
first 10 memories left are the answer, which is what recalling with top_k=10 and that setting returns.
The table gives R@10, nDCG@10 and the mean tokens of those answers (no token limit).
A rule is worth having when it cuts tokens and loses at most ~1 point of R@10.

    python scripts/tune_floor.py --work /tmp/floor --out notes/relevance_floor.md
    python scripts/tune_floor.py --quick --floors 0,0.3 --cliffs 0,0.25    # a smoke run
    python scripts/tune_floor.py --work /tmp/floor --reuse --cliffs ...     # new cliffs, same answers

LoCoMo: each conversation is ingested as turns (speaker, date, captions), one save per chat session,
as scripts/bench_engine.py does; categories 1-4 (questions with evidence). SciFact: the whole corpus in
one session, the train split's queries and qrels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from ir_measures import R, nDCG
from tqdm import tqdm

import bench_engine
import bench_locomo
from tinycontext.retrieval.fusion import cliff_cut

FLOORS = (0.0, 0.3)
CLIFFS = (0.0, 0.15, 0.2, 0.25, 0.3, 0.35)
MEASURES = [R @ 10, nDCG @ 10]


def answers(engines: dict, questions: list[tuple[str, str, str]], to_doc, floor: float, label: str) -> list[dict]:
    """questions: (qid, text, session), each recalled from ``engines[session]``; per question every
    ranked candidate as [doc, tokens, bm25, dense], best first."""
    out = []
    for qid, text, session in tqdm(questions, desc=f"{label} floor {floor}", leave=False):
        engine = engines[session]
        result = engine.recall(text, session_id=session, top_k=engine.config.recall_candidates, max_tokens=bench_engine.UNLIMITED,
                                         min_dense=floor, score_cliff=0.0)
        out.append({"qid": qid, "hits": [[to_doc(m["id"]), m["tokens"], m["scores"]["bm25"], m["scores"]["dense"]]
                                         for m in result["memories"]]})
    return out


def cut(hits: list, cliff: float, top_k: int = 10) -> list:
    return hits[: cliff_cut([(h[2], h[3]) for h in hits], cliff)][:top_k]


def rows_for(label: str, qrels: list, by_floor: dict[str, list[dict]], cliffs) -> list[dict]:
    rows = []
    for floor, answered in by_floor.items():
        for cliff in cliffs:
            kept = [(a["qid"], cut(a["hits"], cliff)) for a in answered]
            run = [(qid, h[0], rank) for qid, hits in kept for rank, h in enumerate(hits, 1)]
            metrics = bench_engine.scores(qrels, run, MEASURES) if qrels else {"R@10": None, "nDCG@10": None}
            rows.append({"dataset": label, "min_dense": float(floor), "score_cliff": cliff, "R@10": metrics["R@10"],
                         "nDCG@10": metrics["nDCG@10"], "tokens_mean": statistics.mean(sum(h[1] for h in hits) for _, hits in kept),
                         "memories_mean": statistics.mean(len(hits) for _, hits in kept),
                         "empty_answers": sum(not hits for _, hits in kept), "questions": len(kept)})
    return rows


def locomo_raw(work: Path, floors, quick: bool) -> dict:
    convs = bench_locomo.load()[: 1 if quick else None]
    qrels, questions, engines = [], [], {}
    try:
        for conv in tqdm(convs, desc="LoCoMo ingest"):
            db = work / f"locomo-{conv['sample_id']}.db"
            db.unlink(missing_ok=True)
            engine = engines[conv["sample_id"]] = bench_engine.new_engine(db)
            dia_to_id, _, _ = bench_engine.ingest_locomo(engine, conv, "turns")
            qrels += bench_locomo.qrels_for(conv, dia_to_id)
            questions += [(q["qid"], q["question"], conv["sample_id"]) for q in bench_locomo.questions(conv)]
        return {"qrels": qrels, "answers": {str(f): answers(engines, questions, str, f, "locomo") for f in floors}}
    finally:
        for engine in engines.values():
            engine.close()


def scifact_raw(work: Path, floors, quick: bool) -> dict:
    corpus, queries, qrels = bench_engine.load_scifact("train")
    db = work / "scifact.db"
    mapping = work / "scifact-ids.json"
    if not (db.exists() and mapping.exists()):
        db.unlink(missing_ok=True)
        with bench_engine.new_engine(db) as engine:
            id_to_doc, _ = bench_engine.index_scifact(engine, corpus)
        mapping.write_text(json.dumps(id_to_doc))
    id_to_doc = json.loads(mapping.read_text())
    items = list(queries.items())[: 100 if quick else None]
    wanted = {q for q, _ in items}
    with bench_engine.new_engine(db) as engine:
        return {"qrels": [x for x in qrels if x[0] in wanted],
                "answers": {str(f): answers({"scifact": engine}, [(q, t, "scifact") for q, t in items], lambda mid: id_to_doc[str(mid)], f, "scifact")
                            for f in floors}}


def unrelated_raw(work: Path, floors) -> dict:
    """A small personal store and queries about something else entirely: what comes back is noise."""
    facts = ["The user prefers pnpm over npm.", "Production deploys go to Fly.io from main.", "Standup is at 09:30 on weekdays.",
             "The cat is called Miso.", "Billing uses PostgreSQL 16.", "Alice reviews all database migrations.",
             "The team's style guide requires type hints.", "Release notes are written on Fridays."]
    unrelated = ["What is the boiling point of ethanol?", "Who painted the Sistine Chapel ceiling?",
                 "How do volcanoes form?", "What is the capital of Australia?", "Explain photosynthesis briefly."]
    db = work / "small.db"
    db.unlink(missing_ok=True)
    with bench_engine.new_engine(db) as engine:
        engine.save(facts, session_id="me")
        return {"qrels": [], "answers": {str(f): answers({"me": engine}, [(str(i), q, "me") for i, q in enumerate(unrelated)], str, f, "unrelated")
                                         for f in floors}}


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| dataset | recall_min_dense | recall_score_cliff | R@10 | nDCG@10 | tokens returned (mean) | memories (mean) | empty answers |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        quality = "–  | –" if r["dataset"].startswith("unrelated") else f"{r['R@10']:.4f} | {r['nDCG@10']:.4f}"
        lines.append(f"| {r['dataset']} | {r['min_dense']:g} | {r['score_cliff']:g} | {quality} | {r['tokens_mean']:.1f} | "
                     f"{r['memories_mean']:.2f} | {r['empty_answers']}/{r['questions']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/tinycontext-floor", help="folder for the databases and raw answers (kept for reuse)")
    parser.add_argument("--floors", default=",".join(map(str, FLOORS)), help="comma-separated recall_min_dense values")
    parser.add_argument("--cliffs", default=",".join(map(str, CLIFFS)), help="comma-separated recall_score_cliff values")
    parser.add_argument("--only", default="locomo,scifact,unrelated")
    parser.add_argument("--quick", action="store_true", help="one LoCoMo conversation, 100 SciFact queries")
    parser.add_argument("--reuse", action="store_true", help="score the answers saved by the last run (raw.json) instead of recalling")
    parser.add_argument("--out", help="write the markdown table here (and JSON beside it)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    floors = [float(f) for f in args.floors.split(",")]
    cliffs = [float(c) for c in args.cliffs.split(",")]
    started = time.time()
    raw_path = work / "raw.json"
    if args.reuse:
        raw = json.loads(raw_path.read_text())
    else:
        only = set(args.only.split(","))
        makers = {"locomo": lambda: locomo_raw(work, floors, args.quick), "scifact": lambda: scifact_raw(work, floors, args.quick),
                  "unrelated": lambda: unrelated_raw(work, floors)}
        raw = {name: make() for name, make in makers.items() if name in only}
        load = os.getloadavg()
        raw["run"] = {"quick": args.quick, "seconds": round(time.time() - started), "load": [round(x, 2) for x in load]}
        raw_path.write_text(json.dumps(raw))
    rows = [row for name in ("locomo", "scifact", "unrelated") if name in raw
            for row in rows_for(name if name != "unrelated" else "unrelated (8 facts)", raw[name]["qrels"], raw[name]["answers"], cliffs)]
    run = raw["run"]
    header = (f"Relevance floor and score cliff ({'quick' if run['quick'] else 'full'}): top_k=10, no token limit, built-in `fast` model; "
              f"recall pass {run['seconds']} s, load average {' '.join(map(str, run['load']))}.")
    text = markdown(rows, header)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps({"rows": rows, "run": run}, indent=2))


if __name__ == "__main__":
    main()

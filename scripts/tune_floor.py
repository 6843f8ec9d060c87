"""Tune the relevance floor (recall_min_dense): tokens returned vs recall on LoCoMo dev and SciFact train.

For each floor setting, every question is recalled with top_k=10 and no token limit; the table gives
R@10 (and nDCG@10) and the mean tokens of the memories returned, plus how many answers came back
empty. A floor is worth having when it cuts tokens and loses at most ~1 point of R@10.

    python scripts/tune_floor.py --work /tmp/floor --out notes/relevance_floor.md
    python scripts/tune_floor.py --floors 0,0.3 --quick        # a smoke run

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

FLOORS = (0.0, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45)
MEASURES = [R @ 10, nDCG @ 10]


def evaluate(engines: dict, questions: list[tuple[str, str, str]], qrels: list, to_doc, floors, label: str) -> list[dict]:
    """questions: (qid, text, session), each recalled from ``engines[session]``. One row per floor."""
    rows = []
    for floor in floors:
        run, tokens, empty = [], [], 0
        for qid, text, session in tqdm(questions, desc=f"{label} floor {floor}", leave=False):
            result = engines[session].recall(text, session_id=session, top_k=10, max_tokens=bench_engine.UNLIMITED, min_dense=floor)
            run += [(qid, to_doc(m["id"]), m["rank"]) for m in result["memories"]]
            tokens.append(result["total_tokens"])
            empty += not result["memories"]
        metrics = bench_engine.scores(qrels, run, MEASURES)
        rows.append({"dataset": label, "min_dense": floor, "R@10": metrics["R@10"], "nDCG@10": metrics["nDCG@10"],
                     "tokens_mean": statistics.mean(tokens), "empty_answers": empty, "questions": len(questions)})
    return rows


def locomo_rows(work: Path, floors, quick: bool) -> list[dict]:
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
        return evaluate(engines, questions, qrels, str, floors, "locomo")
    finally:
        for engine in engines.values():
            engine.close()


def scifact_rows(work: Path, floors, quick: bool) -> list[dict]:
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
        return evaluate({"scifact": engine}, [(q, t, "scifact") for q, t in items], [x for x in qrels if x[0] in wanted],
                        lambda mid: id_to_doc[str(mid)], floors, "scifact")


def unrelated_rows(work: Path, floors) -> list[dict]:
    """A small personal store and queries about something else entirely: what comes back is noise."""
    facts = ["The user prefers pnpm over npm.", "Production deploys go to Fly.io from main.", "Standup is at 09:30 on weekdays.",
             "The cat is called Miso.", "Billing uses PostgreSQL 16.", "Alice reviews all database migrations.",
             "The team's style guide requires type hints.", "Release notes are written on Fridays."]
    unrelated = ["What is the boiling point of ethanol?", "Who painted the Sistine Chapel ceiling?",
                 "How do volcanoes form?", "What is the capital of Australia?", "Explain photosynthesis briefly."]
    db = work / "small.db"
    db.unlink(missing_ok=True)
    rows = []
    with bench_engine.new_engine(db) as engine:
        engine.save(facts, session_id="me")
        for floor in floors:
            returned = [engine.recall(q, session_id="me", top_k=10, min_dense=floor)["memories"] for q in unrelated]
            rows.append({"dataset": "unrelated (8 facts)", "min_dense": floor, "memories_mean": statistics.mean(map(len, returned)),
                         "tokens_mean": statistics.mean(sum(m["tokens"] for m in r) for r in returned)})
    return rows


def markdown(rows: list[dict], unrelated: list[dict], header: str) -> str:
    lines = [header, "", "| dataset | recall_min_dense | R@10 | nDCG@10 | tokens returned (mean) | empty answers |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['min_dense']:g} | {r['R@10']:.4f} | {r['nDCG@10']:.4f} | {r['tokens_mean']:.1f} | "
                     f"{r['empty_answers']}/{r['questions']} |")
    lines += ["", "| unrelated queries | recall_min_dense | memories returned (mean) | tokens (mean) |", "|---|---|---|---|"]
    lines += [f"| {r['dataset']} | {r['min_dense']:g} | {r['memories_mean']:.1f} | {r['tokens_mean']:.1f} |" for r in unrelated]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/tinycontext-floor", help="folder for the databases (kept for reuse)")
    parser.add_argument("--floors", default=",".join(map(str, FLOORS)), help="comma-separated recall_min_dense values")
    parser.add_argument("--only", default="locomo,scifact,unrelated")
    parser.add_argument("--quick", action="store_true", help="one LoCoMo conversation, 100 SciFact queries")
    parser.add_argument("--out", help="write the markdown table here (and JSON beside it)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    floors = [float(f) for f in args.floors.split(",")]
    only = set(args.only.split(","))
    started = time.time()
    rows = []
    if "locomo" in only:
        rows += locomo_rows(work, floors, args.quick)
    if "scifact" in only:
        rows += scifact_rows(work, floors, args.quick)
    unrelated = unrelated_rows(work, floors) if "unrelated" in only else []
    load = os.getloadavg()
    header = (f"Relevance floor sweep ({'quick' if args.quick else 'full'}): top_k=10, no token limit, built-in `fast` model; "
              f"{time.time() - started:.0f} s, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")
    text = markdown(rows, unrelated, header)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps({"rows": rows, "unrelated": unrelated}, indent=2))


if __name__ == "__main__":
    main()

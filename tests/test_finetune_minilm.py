"""scripts/finetune_minilm.py without torch: the data it trains on (fit/dev split, BM25 hard negatives, the
engine's token ids) on a tiny SciFact slice, and the export's quantisation, which must rebuild the built-in
int8 model file byte for byte from the fp32 export of the same model."""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import finetune_minilm as ft  # noqa: E402
from tinycontext.models.checksum import file_sha256  # noqa: E402
from tinycontext.models.embedder import _load_tokenizer  # noqa: E402
from tinycontext.models.hub import BUILTIN_SHA256, builtin_bundle  # noqa: E402


def test_split_is_seeded_disjoint_and_complete():
    qids = [str(i) for i in range(50)]
    fit, dev = ft.split_queries(qids, 0.2, seed=3)
    assert len(dev) == 10 and set(fit) | set(dev) == set(qids) and not set(fit) & set(dev)
    assert ft.split_queries(qids, 0.2, seed=3) == (fit, dev)
    assert ft.split_queries(qids, 0.2, seed=4)[1] != dev
    assert fit == sorted(fit, key=int)  # original order kept


def test_hard_negatives_skip_cited_documents_and_keep_rank_order():
    ranked = ["a", "p", "b", "c", "q", "d"]
    got = ft.hard_negatives(ranked, {"p", "q"}, 3, random.Random(0))
    assert len(got) == 3 and not {"p", "q"} & set(got)
    assert got == sorted(got, key=ranked.index)
    assert ft.hard_negatives(["p"], {"p"}, 3, random.Random(0)) == []


def _tiny_scifact(shared: Path, folder: Path, queries: int = 6, others: int = 40) -> dict[str, dict[str, int]]:
    """The first ``queries`` train queries of SciFact, their cited abstracts and ``others`` more."""
    scifact = shared / "datasets" / "scifact"
    with (scifact / "qrels" / "train.tsv").open() as fh:
        rows = [r for r in csv.reader(fh, delimiter="\t")][1:]
    qrels: dict[str, dict[str, int]] = {}
    for q, d, s in rows:
        if q in qrels or len(qrels) < queries:
            qrels.setdefault(q, {})[d] = int(s)
    cited = {d for ds in qrels.values() for d in ds}
    corpus = [json.loads(line) for line in (scifact / "corpus.jsonl").open()]
    keep = [c for c in corpus if c["_id"] in cited] + [c for c in corpus if c["_id"] not in cited][:others]
    folder.mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in keep))
    (folder / "queries.jsonl").write_text("".join(line for line in (scifact / "queries.jsonl").open()
                                                  if json.loads(line)["_id"] in qrels))
    ft.write_qrels(folder / "qrels" / "train.tsv", list(qrels), qrels)
    ft.write_qrels(folder / "qrels" / "test.tsv", list(qrels)[:1], qrels)
    return qrels


def test_prepare_writes_what_the_engine_would_embed(tmp_path, shared_dir):
    qrels = _tiny_scifact(shared_dir, tmp_path / "sf")
    meta = ft.prepare(tmp_path / "out", scifact=tmp_path / "sf", dev_fraction=0.34, seed=1, negatives=2, pool=30)
    assert (meta["fit_queries"], meta["dev_queries"]) == (4, 2)
    data = json.loads((tmp_path / "out" / "train.json").read_text())
    tokenizer = _load_tokenizer(builtin_bundle())[0]
    corpus = {json.loads(line)["_id"]: json.loads(line) for line in (tmp_path / "sf" / "corpus.jsonl").open()}
    for e in data["examples"]:
        assert set(e["positives"]) == set(qrels[e["qid"]])
        assert e["negatives"] and not set(e["negatives"]) & set(qrels[e["qid"]])
        assert e["query_ids"] == tokenizer.encode(e["query"]).ids
        for d in e["positives"] + e["negatives"]:
            text = f"{corpus[d]['title'].strip()}\n{corpus[d]['text'].strip()}"  # the harness's document text
            assert data["doc_ids"][d] == tokenizer.encode(text).ids
            assert len(data["doc_ids"][d]) <= builtin_bundle().max_tokens
    split = {}
    for name in ("train", "dev"):
        with (tmp_path / "out" / "beir" / "qrels" / f"{name}.tsv").open() as fh:
            split[name] = {r[0] for r in list(csv.reader(fh, delimiter="\t"))[1:]}
    assert split["train"] == {e["qid"] for e in data["examples"]}
    assert not split["train"] & split["dev"] and split["train"] | split["dev"] == set(qrels)


def test_export_quantises_like_the_builtin(tmp_path, shared_dir):
    template = shared_dir / "models" / "minilm-l6-int8" / "model.onnx"
    fp32 = shared_dir / "models" / "minilm-l6-fp32" / "model.onnx"
    state = ft.fp32_state(fp32)
    assert ft.check_recipe(template, fp32) == {"int8_weights_equal": 1.0, "max_step_difference": 0}
    ft.write_int8(state, template, tmp_path / "same.onnx")
    assert file_sha256(tmp_path / "same.onnx") == BUILTIN_SHA256
    state["encoder.layer.0.intermediate.dense.weight"] = state["encoder.layer.0.intermediate.dense.weight"] * np.float32(1.5)
    ft.write_int8(state, template, tmp_path / "changed.onnx")
    assert file_sha256(tmp_path / "changed.onnx") != BUILTIN_SHA256


def _tiny_locomo(shared: Path, path: Path, sessions: int = 2) -> dict:
    """The first conversation of LoCoMo dev cut to its first ``sessions`` chat sessions, with the questions
    whose evidence all lies in them."""
    sample = json.loads((shared / "datasets" / "locomo" / "locomo-dev.json").read_text())[0]
    keep = {f"D{n}" for n in range(1, sessions + 1)}
    conversation = {k: v for k, v in sample["conversation"].items()
                    if not k.startswith("session_") or k.split("_")[1] in {str(n) for n in range(1, sessions + 1)}}
    qa = [q for q in sample["qa"] if q.get("evidence") and all(e.split(":")[0] in keep for e in q["evidence"])]
    tiny = {**sample, "conversation": conversation, "qa": qa}
    path.write_text(json.dumps([tiny]))
    return tiny


def test_prepare_locomo_turns_as_the_engine_embeds_them(tmp_path, shared_dir):
    _tiny_scifact(shared_dir, tmp_path / "sf")
    tiny = _tiny_locomo(shared_dir, tmp_path / "locomo.json")
    meta = ft.prepare(tmp_path / "out", scifact=tmp_path / "sf", dev_fraction=0.34, seed=1, negatives=3, pool=30,
                      locomo=tmp_path / "locomo.json")
    data = json.loads((tmp_path / "out" / "train.json").read_text())
    turns = [e for e in data["examples"] if e["group"] != "scifact"]
    questions = {f"conv-26:q{i}": q for i, q in enumerate(tiny["qa"]) if q["category"] in (1, 2, 3, 4)}
    assert meta["locomo_questions"] == len(questions) and meta["locomo_examples"] == {"conv-26": len(turns)}
    tokenizer = _load_tokenizer(builtin_bundle())[0]
    session_turns = [t for n in (1, 2) for t in tiny["conversation"][f"session_{n}"]]
    for qid, qa in questions.items():
        mine = [e for e in turns if e["qid"] == qid]
        evidence = {f"conv-26:{d}" for d in qa["evidence"]}
        # one example per evidence turn, each masking the question's other evidence turns
        assert sorted(e["target"] for e in mine) == sorted(evidence)
        assert all(e["category"] == qa["category"] for e in mine)  # train --repeat-category reads it
        assert all(set(e["positives"]) == evidence and e["query_ids"] == tokenizer.encode(qa["question"]).ids for e in mine)
        for e in mine:
            # (a 35-turn slice: the search's lists may hold fewer than 3 other turns)
            assert 1 <= len(e["negatives"]) <= 3 and not set(e["negatives"]) & evidence
            assert all(n.startswith("conv-26:D") for n in e["negatives"])
    # the text of a turn is the engine's embedding text: date of its chat session, speaker, caption
    d1_5 = next(t for t in session_turns if t["dia_id"] == "D1:5")
    expected = f"[8 May 2023] Caroline: {d1_5['text']} [shares {d1_5['blip_caption']}]"
    assert data["doc_ids"]["conv-26:D1:5"] == tokenizer.encode(expected).ids
    assert data["doc_ids"]["conv-26:D2:1"][:6] == tokenizer.encode("[25 May 2023] Melanie:").ids[:6]
    # every turn of the conversation is kept (train --mine-negatives ranks them all), in the chat's order
    assert data["turns"] == {"conv-26": [f"conv-26:{t['dia_id']}" for t in session_turns]}
    assert all(d in data["doc_ids"] for d in data["turns"]["conv-26"])
    # adversarial questions and the dataset's observations join after the answerable questions, which stay as they were
    more = ft.prepare(tmp_path / "more", scifact=tmp_path / "sf", dev_fraction=0.34, seed=1, negatives=3, pool=30,
                      locomo=tmp_path / "locomo.json", locomo_extra=("adversarial", "observations"))
    extended = json.loads((tmp_path / "more" / "train.json").read_text())["examples"]
    assert extended[:len(data["examples"])] == data["examples"]
    added = extended[len(data["examples"]):]
    facts = [(fact, raw) for by_speaker in tiny["observation"].values() for facts in by_speaker.values() for fact, raw in facts
             if raw.split(":")[0] in {"D1", "D2"}]
    adversarial = [q for q in tiny["qa"] if q["category"] == 5]
    assert more["locomo_adversarial_examples"] == sum(len(set(q["evidence"])) for q in adversarial) > 0
    assert more["locomo_observations_examples"] == len(facts) > 0
    assert [e["query"] for e in added if e["source"] == "observations"] == [fact for fact, _ in facts]
    assert all(e["target"] == f"conv-26:{raw}" for e, (_, raw) in zip([e for e in added if e["source"] == "observations"], facts))
    assert {e["category"] for e in added if e["source"] == "adversarial"} == {5}
    assert not any("category" in e for e in added if e["source"] == "observations")  # facts are not questions
    # the speakers' own questions -> the answering turn; the asking turn is masked (same words, not the answer)
    chat = ft.prepare(tmp_path / "chat", scifact=tmp_path / "sf", dev_fraction=0.34, seed=1, negatives=3, pool=30,
                      locomo=tmp_path / "locomo.json", locomo_extra=("dialog",))
    asked = [e for e in json.loads((tmp_path / "chat" / "train.json").read_text())["examples"] if e.get("source") == "dialog"]
    assert chat["locomo_dialog_examples"] == len(asked) > 0
    for e in asked:
        number = int(e["qid"].rsplit(":", 1)[1])
        asker = next(t for t in session_turns if t["dia_id"] == e["qid"].split(":a", 1)[1])
        assert e["target"] == f"conv-26:{asker['dia_id'].split(':')[0]}:{number + 1}" and e["positives"] == [e["target"], f"conv-26:{asker['dia_id']}"]
        assert not set(e["negatives"]) & set(e["positives"]) and "category" not in e


def test_batches_keep_groups_apart_and_folds_leave_a_conversation_out():
    examples = [{"qid": f"s{i}", "group": "scifact", "positives": [f"d{i}", f"d{i + 1}"], "negatives": ["n"]} for i in range(10)]
    examples += [{"qid": f"c{i // 2}", "group": f"conv-{i % 2}", "target": f"t{i}", "positives": [f"t{i}", f"t{i ^ 1}"],
                  "negatives": []} for i in range(12)]
    plan = ft.batches(examples, 4, random.Random(0))
    assert sorted(e["qid"] for b in plan for e, _, _ in b) == sorted(e["qid"] for e in examples)
    for batch in plan:
        assert len({e["group"] for e, _, _ in batch}) == 1 and len(batch) <= 4
        assert len({p for _, p, _ in batch}) == len(batch)  # no two examples on one positive
        assert all(p == e["target"] if "target" in e else p in e["positives"] for e, p, _ in batch)
        assert all(negs == (["n"] if e["negatives"] else []) for e, _, negs in batch)
    # several hard negatives a step: each example's own, distinct, as many as it has
    examples[0]["negatives"] = ["n", "m", "o", "p"]
    for k in (2, 4, 9):
        drawn = {e["qid"]: negs for b in ft.batches(examples, 4, random.Random(0), negatives=k) for e, _, negs in b}
        assert set(drawn["s0"]) <= {"n", "m", "o", "p"} and len(set(drawn["s0"])) == min(k, 4)
        assert drawn["s1"] == ["n"] and drawn["c0"] == []
    fold = ft.fold_examples(examples, "conv-1")
    assert {e["group"] for e in fold} == {"scifact", "conv-0"} and len(fold) == 16
    assert {e["group"] for e in ft.fold_examples(examples, "conv-1", ("scifact",))} == {"conv-0"}
    try:
        ft.fold_examples(examples, "conv-9")
    except ValueError:
        pass
    else:
        raise AssertionError("a fold of a conversation that has no examples must fail")


def test_a_repeated_category_weighs_n_fold_and_a_copy_never_meets_its_original():
    examples = [{"qid": f"c{i}", "group": "conv-0", "target": f"t{i}", "positives": [f"t{i}"], "negatives": [], "category": 1 + i % 3}
                for i in range(30)] + [{"qid": "s0", "group": "scifact", "positives": ["d0"], "negatives": []}]
    repeated = ft.repeat_categories(examples, ["1=3", "2=2"])
    count = {e["qid"]: sum(r is e for r in repeated) for e in examples}
    assert all(count[e["qid"]] == {1: 3, 2: 2}.get(e.get("category"), 1) for e in examples)
    assert ft.repeat_categories(examples, []) == examples
    for seed in range(5):
        for batch in ft.batches(repeated, 8, random.Random(seed)):
            assert len({e["qid"] for e, _, _ in batch}) == len(batch)  # a copy is its original's false negative
    for bad in (["4=2"], ["1=0"]):
        with pytest.raises(ValueError):
            ft.repeat_categories(examples, bad)


def test_mined_negatives_are_drawn_from_what_the_model_ranks_highest_without_the_evidence():
    # a stand-in embedder (a bag of token ids, unit length), so the ranking is known: for the question [1],
    # t1 and t5 are evidence, t2 and t3 the best other turns, t4 a worse one, the rest share nothing with it
    def embed(seqs):
        v = np.zeros((len(seqs), 16))
        for i, s in enumerate(seqs):
            v[i, s] = 1
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    turns = {"conv-0": [f"t{k}" for k in range(10)], "conv-1": ["u0", "u1"]}
    doc_ids = {"t1": [1], "t2": [1, 2], "t3": [1, 2, 3], "t4": [1, 2, 3, 4, 5], "t5": [1, 6], "t0": [7], "t6": [8], "t7": [9],
               "t8": [10], "t9": [11], "u0": [1], "u1": [12]}
    q = {"qid": "q", "group": "conv-0", "query_ids": [1], "target": "t1", "positives": ["t1", "t5"], "negatives": ["t9"]}
    other = {"qid": "o", "group": "conv-1", "query_ids": [12], "target": "u1", "positives": ["u1"], "negatives": []}
    sf = {"qid": "s", "group": "scifact", "query_ids": [1], "positives": ["d"], "negatives": ["n"]}
    for pool, allowed in ((2, {"t2", "t3"}), (3, {"t2", "t3", "t4"})):
        drawn = set()
        for seed in range(20):
            plan = [[(q, "t1", ["t9"]), (sf, "d", ["n"])], [(other, "u1", [])], [(q, "t5", ["t9", "t0"])]]
            assert ft.mine_negatives(embed, plan, doc_ids, turns, pool, random.Random(seed), batch=3) == 3
            assert len(plan[0][0][2]) == 1 and len(plan[2][0][2]) == 2 and plan[1][0][2] == ["u0"]  # at least one
            assert plan[0][1] == (sf, "d", ["n"])  # not a conversation: as prepared
            drawn |= set(plan[0][0][2]) | set(plan[2][0][2])
        assert drawn == allowed


# two questions per conversation with equal differences: scipy warns that its t-test has nothing to vary
@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")
def test_loco_scores_each_conversation_with_the_fold_that_never_saw_it(tmp_path):
    metrics = {m: 0.0 for m in ft.LOCO_METRICS}

    def run(name: str, scores: dict[str, float]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        rows = [{"query_id": q, "session": q.split(":")[0], "category": 1 + i % 2, **metrics, "recall@10": r}
                for i, (q, r) in enumerate(scores.items())]
        pd.DataFrame(rows).to_csv(folder / "per_query.csv", index=False)
        return folder

    questions = ["a:q0", "a:q1", "b:q0", "b:q1"]
    base = run("base", dict.fromkeys(questions, 0.5))
    # each fold scores its own held-out conversation 1.0 or 0.0, the other (trained-on) one 0.9
    fold_a = run("fold_a", {"a:q0": 1.0, "a:q1": 1.0, "b:q0": 0.9, "b:q1": 0.9})
    fold_b = run("fold_b", {"a:q0": 0.9, "a:q1": 0.9, "b:q0": 0.0, "b:q1": 1.0})
    report = ft.loco(base, {"a": fold_a, "b": fold_b}, tmp_path / "pooled.csv")
    r10 = report["all"]["recall@10"]
    assert report["all"]["questions"] == 4 and report["missing_conversations"] == []
    assert (r10["builtin"], r10["loco"], r10["difference"]) == (0.5, 0.75, 0.25) and (r10["wins"], r10["losses"]) == (3, 1)
    assert report["conversation"]["a"]["recall@10"]["loco"] == 1.0 and report["conversation"]["b"]["recall@10"]["loco"] == 0.5
    assert report["category"][2]["recall@10"]["loco"] == 1.0  # a:q1 and b:q1
    pooled = pd.read_csv(tmp_path / "pooled.csv").set_index("query_id")
    assert pooled.loc["b:q0", "loco_recall@10"] == 0.0 and pooled.loc["b:q0", "builtin_recall@10"] == 0.5
    assert ft.loco(base, {"a": fold_a})["missing_conversations"] == ["b"]
    # one recipe's fold runs against another's, each conversation from the fold that never saw it on both sides
    other = ft.loco({"a": fold_b, "b": fold_a}, {"a": fold_a, "b": fold_b})
    r10 = other["all"]["recall@10"]
    assert (r10["builtin"], r10["loco"], r10["difference"]) == pytest.approx((0.9, 0.75, -0.15)) and other["missing_conversations"] == []
    assert ft.loco({"a": fold_a, "b": fold_b}, {"a": fold_a})["missing_conversations"] == ["b"]


def test_soup_is_the_mean_of_runs_that_left_out_the_same_conversation(tmp_path):
    def run(name: str, scale: float, held: str | None, locomo: bool = True) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        np.savez(folder / "weights.npz", a=np.full((2, 3), scale, np.float32), b=np.arange(4, dtype=np.float32) * scale)
        prepare = {"fit_queries": 3, **({"locomo": "locomo-dev.json"} if locomo else {})}
        log = {"args": {"tag": name, "seed": 0, "holdout_conversation": held}, "prepare": prepare, "examples": 7}
        (folder / "train_log.json").write_text(json.dumps(log))
        return folder

    members = [run("x", 1.0, "conv-26"), run("y", 3.0, "conv-26")]
    assert ft.soup(tmp_path / "soup", members) == {"members": 2, "holdout_conversation": "conv-26", "tensors": 2, "weights": [0.5, 0.5]}
    z = np.load(tmp_path / "soup" / "weights.npz")
    np.testing.assert_array_equal(z["a"], np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(z["b"], np.arange(4, dtype=np.float32) * 2.0)
    log = json.loads((tmp_path / "soup" / "train_log.json").read_text())
    assert log["args"]["tag"] == "soup" and log["args"]["holdout_conversation"] == "conv-26" and len(log["members"]) == 2
    with pytest.raises(ValueError, match="different conversations"):
        ft.soup(tmp_path / "bad", [members[0], run("z", 2.0, "conv-30")])
    # a run that saw no LoCoMo conversation (the SciFact start) joins any fold: weighted, a WiSE-FT interpolation
    start = run("start", 5.0, None, locomo=False)
    wise = ft.soup(tmp_path / "wise", [members[0], start], [3, 1])
    assert wise["holdout_conversation"] == "conv-26" and wise["weights"] == [0.75, 0.25]
    np.testing.assert_array_equal(np.load(tmp_path / "wise" / "weights.npz")["a"], np.full((2, 3), 2.0, np.float32))
    log = json.loads((tmp_path / "wise" / "train_log.json").read_text())
    assert log["args"]["holdout_conversation"] == "conv-26" and log["prepare"]["locomo"] == "locomo-dev.json"
    ft.soup(tmp_path / "past", [members[0], start], [1.25, -0.25])  # extrapolated away from the start
    np.testing.assert_array_equal(np.load(tmp_path / "past" / "weights.npz")["a"], np.zeros((2, 3), np.float32))
    for bad in ([1.0], [1.0, -1.0], [0.0, 0.0]):
        with pytest.raises(ValueError, match="one weight"):
            ft.soup(tmp_path / "bad_weights", [members[0], start], bad)

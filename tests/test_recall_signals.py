"""One search, many recalls: ``recall(..., signals=engine.search(...))`` gives exactly what a plain
recall gives, for every fusion, floor, cliff and budget setting; ``ranking`` is the deep order a
second recall would return. What the evaluation harness relies on to score many configs fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinycontext import InvalidInputError, Signals

TINY = Path(__file__).resolve().parents[1] / "evals" / "data" / "tiny"
TURNS = [("Alice", "I take my coffee with oat milk, no sugar."), ("Bob", "Gluten makes me ill, so no bread for me."),
         ("Alice", "Dave adopted a grey cat called Miso last spring."), ("Bob", "The cat sleeps on the router all day.")]
# Hybrid with and without the floor and cliff, BM25 alone, dense alone, other k, budgets and depths.
CONFIGS = [{}, {"dense_weight": 0.0}, {"dense_weight": 1.0}, {"dense_weight": 0.3, "rrf_k": 60},
           {"dense_weight": 0.8, "rrf_k": 100, "min_dense": 0.0, "score_cliff": 0.0}, {"min_dense": 0.5, "score_cliff": 0.6},
           {"top_k": 3, "max_tokens": 40}, {"candidates": 5, "top_k": 4}, {"candidates": 5, "top_k": 4, "offset": 3},
           {"episode_weight": 0.0, "neighbour_weight": 0.0, "speaker_boost": 0.0}]
UNLIMITED = 1_000_000
SEARCH = ("session_id", "tags", "filters", "candidates")


def same(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k not in ("elapsed_ms", "ranking")}


@pytest.fixture
def filled(engine):
    docs = [json.loads(line) for line in (TINY / "corpus.jsonl").read_text().splitlines()]
    engine.save([{"content": d["text"], "tags": ["tiny"]} for d in docs], session_id="docs")
    engine.save([{"content": text, "speaker": who} for who, text in TURNS], session_id="chat")
    return engine


def test_recall_from_one_search_equals_plain_recall_for_every_setting(filled):
    queries = [json.loads(line)["text"] for line in (TINY / "queries.jsonl").read_text().splitlines()]
    cases = [(q, {}) for q in queries] + [(q, {"session_id": "chat"}) for q in queries[:4]]
    cases += [(queries[0], {"tags": ["tiny"]}), (queries[1], {"filters": {"tags_all": ["tiny"]}})]
    searches: dict = {}
    dropped = {"below_floor": 0, "below_cliff": 0, "skipped_for_budget": 0}
    for config in CONFIGS:
        for query, scope in cases:
            settings = {**config, **scope}
            wanted = {k: settings[k] for k in SEARCH if k in settings}
            key = (query, json.dumps(wanted, sort_keys=True))
            if key not in searches:  # searched once, shared by every config, as the harness does
                searches[key] = filled.search(query, **wanted)
                # Kept on disk as JSON (the harness does), it comes back equal.
                assert Signals.from_dict(json.loads(json.dumps(searches[key].to_dict()))) == searches[key]
            signals = searches[key]
            plain = filled.recall(query, **settings)
            depth = min(100, settings.get("candidates", 100))  # the harness's ranking depth
            fused = filled.recall(query, signals=signals, ranking=depth, **settings)
            assert same(fused) == same(plain), (query, settings)
            deep = filled.recall(query, **{**settings, "top_k": depth, "max_tokens": UNLIMITED})
            assert fused["ranking"] == [{k: m[k] for k in ("id", "rank", "scores")} for m in deep["memories"]], (query, settings)
            page = filled.recall_rendered(query, signals=signals, **{k: v for k, v in settings.items() if k != "max_tokens"})
            assert page == filled.recall_rendered(query, **{k: v for k, v in settings.items() if k != "max_tokens"})
            dropped["below_floor"] += plain["below_floor"]
            dropped["below_cliff"] += plain["below_cliff"]
            dropped["skipped_for_budget"] += plain["truncated"]
    assert all(dropped.values()), dropped  # the floor, the cliff and the budget each acted somewhere


def test_signals_of_another_search_are_refused(filled):
    signals = filled.search("Which pet does Dave have?")
    for other in ({"candidates": 50}, {"session_id": "chat"}, {"tags": ["tiny"]}):
        with pytest.raises(InvalidInputError, match="signals"):
            filled.recall("Which pet does Dave have?", signals=signals, **other)
    with pytest.raises(InvalidInputError, match="signals"):
        filled.recall("Who owns a cat?", signals=signals)
    assert filled.search("Which pet does Dave have?") == signals  # a search is repeatable

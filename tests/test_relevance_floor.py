"""The relevance floor: an unrelated query on a small store returns (almost) nothing, a related one
still finds its memory, and the floor is reported (real MiniLM model: the similarities matter)."""

from __future__ import annotations

from tinycontext import TinyContextConfig
from tinycontext.retrieval import Candidate, relevance_floor

FACTS = ["The user prefers pnpm over npm.", "Production deploys go to Fly.io from main.", "Standup is at 09:30 on weekdays.",
         "The cat is called Miso.", "Billing uses PostgreSQL 16.", "Alice reviews all database migrations.",
         "The team's style guide requires type hints.", "Release notes are written on Fridays."]
UNRELATED = ["What is the boiling point of ethanol?", "Who painted the Sistine Chapel ceiling?", "How do volcanoes form?"]


def test_default_floor_drops_noise_and_keeps_evidence(engine):
    assert TinyContextConfig().recall_min_dense > 0
    engine.save(FACTS, session_id="me")
    for query in UNRELATED:
        result = engine.recall(query, session_id="me")
        assert len(result["memories"]) <= 1, (query, [m["content"] for m in result["memories"]])
        assert result["below_floor"] >= len(FACTS) - 1
        page = engine.recall_rendered(query, session_id="me")
        assert page.structured["below_floor"] == result["below_floor"]
    found = engine.recall("what is the name of our cat?", session_id="me")["memories"]
    assert found and found[0]["content"] == "The cat is called Miso."
    # Off: the dense side always has neighbours, so every memory comes back.
    assert len(engine.recall(UNRELATED[0], session_id="me", min_dense=0.0)["memories"]) == len(FACTS)


def test_floor_is_a_separate_step():
    ranked = [Candidate(1, bm25=2.0, dense=0.05), Candidate(2, dense=0.9), Candidate(3, dense=0.1), Candidate(4, bm25=1.0)]
    kept, dropped = relevance_floor(ranked, 0.3)
    assert [c.id for c in kept] == [1, 2, 4] and dropped == 1  # a lexical match is evidence whatever its similarity
    assert relevance_floor(ranked, 0.0) == (ranked, 0)

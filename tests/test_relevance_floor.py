"""The relevance floor: an unrelated query on a small store returns (almost) nothing, a related one
still finds its memory, and the floor is reported (real MiniLM model: the similarities matter)."""

from __future__ import annotations

from tinycontext import TinyContextConfig
from tinycontext.retrieval.fusion import Candidate, cliff_cut, gap_cut, relevance_floor

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
    assert len(engine.recall(UNRELATED[0], session_id="me", min_dense=0.0, score_cliff=0.0)["memories"]) == len(FACTS)


def test_floor_is_a_separate_step():
    ranked = [Candidate(1, bm25=2.0, dense=0.05), Candidate(2, dense=0.9), Candidate(3, dense=0.1), Candidate(4, bm25=1.0)]
    kept, dropped = relevance_floor(ranked, 0.3)
    assert [c.id for c in kept] == [1, 2, 4] and dropped == 1  # a lexical match is evidence whatever its similarity
    assert relevance_floor(ranked, 0.0) == (ranked, 0)


def test_score_cliff_ends_the_answer_where_the_rest_is_clearly_weaker():
    ranked = [(12.0, 0.62), (None, None), (9.0, 0.35), (3.0, 0.20), (None, None), (2.0, 0.25)]
    assert cliff_cut(ranked, 0.0) == 6
    # From position 3 on, every scored candidate is below half the best above it (12, 0.62); context
    # turns (no scores) never end the answer, and one right after its last memory stays with it.
    assert cliff_cut(ranked, 0.5) == 3
    assert cliff_cut([(12.0, 0.62), (3.0, 0.2), (None, None), (9.0, 0.5), (None, None), (1.0, 0.1)], 0.5) == 5
    assert cliff_cut(ranked, 0.8) == 6
    # One weak candidate does not end it while a strong one follows.
    assert cliff_cut([(12.0, 0.62), (3.0, 0.2), (11.0, 0.6)], 0.5) == 3
    # A kind of evidence nothing above had is not "weaker"; a lacking score is.
    assert cliff_cut([(None, 0.6), (4.0, 0.1)], 0.5) == 2
    assert cliff_cut([(8.0, 0.6), (None, 0.2)], 0.5) == 1


def test_score_gap_ends_the_answer_after_the_last_score_within_it_of_the_best():
    import math

    # learned scores 0, -1, -2.5, -1.5, -6 as learned_rerank hands them on: exp(score - best)
    scores = [math.exp(s) for s in (0.0, -1.0, -2.5, -1.5, -6.0)]
    assert gap_cut(scores, 0.0) == 5  # off
    assert gap_cut(scores, 0.5) == 1
    assert gap_cut(scores, 2.0) == 4  # one weaker turn does not end it while one within the gap follows
    assert gap_cut(scores, 2.6) == 4 and gap_cut(scores, 6.5) == 5
    # the best above, not the first: a later boost (the time windows) may lift a turn above the first
    assert gap_cut([0.5, 1.0, 0.2, 0.4], math.log(3)) == 4 and gap_cut([0.5, 1.0, 0.2, 0.3], math.log(3)) == 2
    assert gap_cut([], 1.0) == 0 and gap_cut([0.3], 0.1) == 1


def test_score_cliff_in_recall_is_reported_and_pages_agree(engine):
    assert TinyContextConfig().recall_score_cliff > 0
    engine.save(FACTS + ["Miso the cat sleeps on the red sofa.", "The cat Miso eats salmon on Sundays."], session_id="me")
    query = "what does the cat Miso eat?"
    full = engine.recall(query, session_id="me", score_cliff=0.0, min_dense=0.0)
    cut = engine.recall(query, session_id="me", score_cliff=0.5, min_dense=0.0)
    assert cut["memories"][0]["content"] == "The cat Miso eats salmon on Sundays."
    kept = len(cut["memories"])
    assert kept < len(full["memories"]) and cut["below_cliff"] == full["candidates"] - kept
    assert [m["id"] for m in cut["memories"]] == [m["id"] for m in full["memories"][:kept]]
    assert kept == cliff_cut([(m["scores"]["bm25"], m["scores"]["dense"]) for m in full["memories"]], 0.5)
    # Page 2 starts where page 1 ended and stops at the same place.
    second = engine.recall(query, session_id="me", score_cliff=0.5, min_dense=0.0, top_k=1, offset=1)
    assert [m["id"] for m in second["memories"]] == [m["id"] for m in cut["memories"][1:2]]
    page = engine.recall_rendered(query, session_id="me", top_k=10)
    assert page.structured.get("below_cliff", 0) == engine.recall(query, session_id="me")["below_cliff"]
    # A single-signal ranking (BM25 alone, dense alone) keeps its whole order: the cliff reads agreement.
    for weight in (0.0, 1.0):
        alone = engine.recall(query, session_id="me", score_cliff=0.5, min_dense=0.0, dense_weight=weight)
        every = engine.recall(query, session_id="me", score_cliff=0.0, min_dense=0.0, dense_weight=weight)
        assert alone["below_cliff"] == 0 and [m["id"] for m in alone["memories"]] == [m["id"] for m in every["memories"]]


"""Time a question names (tinycontext/retrieval/time_windows.py) and the recall boost it drives (recall_time_boost)."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest
from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.retrieval.fusion import Candidate
from tinycontext.retrieval.time_windows import TimeWindow, boost, question_windows

NOW = datetime(2023, 10, 20, 15, 0)  # a Friday


def spans(query: str) -> list[tuple[str, str, bool]]:
    return [(w.start.isoformat(), w.end.isoformat(), w.any_year) for w in question_windows(query, NOW)]


@pytest.mark.parametrize("query,expected", [
    ("What did Maria paint on October 13, 2023?", [("2023-10-13", "2023-10-14", False)]),
    ("What did Gina find on 1 February, 2023?", [("2023-02-01", "2023-02-02", False)]),
    ("What happened on 2023-05-08?", [("2023-05-08", "2023-05-09", False)]),
    ("What did Maria start in December 2023?", [("2023-12-01", "2024-01-01", False)]),
    ("How often did she go to the beach in 2023?", [("2023-01-01", "2024-01-01", False)]),
    ("Where did they camp in June?", [("2023-06-01", "2023-07-01", True)]),  # no year: June of any year
    ("What happened on the 3rd of March?", [("2023-03-03", "2023-03-04", True)]),
    ("What did John do yesterday?", [("2023-10-19", "2023-10-20", False)]),
    ("What did I eat last Saturday?", [("2023-10-14", "2023-10-15", False)]),
    ("Who came over last weekend?", [("2023-10-14", "2023-10-16", False)]),
    ("What did we decide a couple of weeks ago?", [("2023-10-02", "2023-10-09", False)]),
    ("What did we plan last month?", [("2023-09-01", "2023-10-01", False)]),
    ("Where did we travel last year?", [("2022-01-01", "2023-01-01", False)]),
    ("Where did Caroline move from 4 years ago?", [("2019-01-01", "2020-01-01", False)]),
])
def test_phrases_resolve_to_windows(query, expected):
    assert spans(query) == expected


@pytest.mark.parametrize("query", ["Did May like the painting?", "What may I bring?", "What did Caroline research?",
                                   "Call 555-2023-11 now", "What is Max's favorite toy?", "Who won 10 games?"])
def test_no_time_named(query):
    assert question_windows(query, NOW) == []


def test_window_contains_local_and_saved_times():
    day = TimeWindow(date(2023, 5, 8), date(2023, 5, 9))
    assert day.contains("2023-05-08T13:56") and day.contains("2023-05-08")
    assert not day.contains("2023-05-09T00:01") and not day.contains(None)
    saved = "2023-05-08T12:00:00.123456+00:00"  # created_at: UTC, counted on the local calendar
    local = datetime.fromisoformat(saved).astimezone().date()
    window = TimeWindow(local, local + timedelta(days=1))
    assert window.contains(saved) and window.contains("2023-05-08T12:00Z")
    june_any_year = TimeWindow(date(2023, 6, 1), date(2023, 7, 1), any_year=True)
    assert june_any_year.contains("2019-06-30") and not june_any_year.contains("2023-07-01")


def test_boost_reorders_stably():
    ranked = [Candidate(1, rrf=0.30), Candidate(2, rrf=0.20), Candidate(3, rrf=0.20), Candidate(4, rrf=0.10)]
    window = [TimeWindow(date(2023, 5, 8), date(2023, 5, 9))]
    times = {1: "2023-01-01", 2: "2023-05-08T10:00", 3: "2023-05-08", 4: "2023-05-08"}
    assert [c.id for c in boost(ranked, times, window, 1.0)] == [2, 3, 1, 4]  # 0.4, 0.4 (tie keeps order), 0.3, 0.2
    assert [c.id for c in boost(ranked, times, [], 1.0)] == [2, 3, 1, 4]  # no window: nothing changes


def test_recall_time_boost(tmp_path):
    yesterday = (date.today() - timedelta(days=1)).isoformat()
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        old, recent = engine.save([{"content": "we decided to use postgres", "speaker": "Ana", "occurred_at": "2020-01-07"},
                                   {"content": "we decided to use sqlite", "speaker": "Ben", "occurred_at": yesterday}])["ids"]
        plain = engine.save(["we decided the deploy day"], session_id="notes")["ids"][0]  # saved now: no occurred_at

        # Weighted RRF fusion: the learned one already puts the second turn first (it answers the first).
        def order(query, **kwargs):
            return [m["id"] for m in engine.recall(query, session_id="default", score_cliff=0.0, fusion="rrf", **kwargs)["memories"]]

        assert order("what did we decide yesterday") == [old, recent]  # off by default: BM25 has no word for it
        assert order("what did we decide yesterday", time_boost=1.0) == [recent, old]
        assert order("what did we decide in January 2020", time_boost=1.0) == [old, recent]
        # A memory without occurred_at is dated by when it was saved.
        assert engine.recall("what did we decide today", session_id="notes", time_boost=1.0)["memories"][0]["id"] == plain
    with MemoryEngine(TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", recall_time_boost=1.0,
                                         recall_fusion="rrf"),
                      embedder=HashEmbedder()) as engine:
        assert [m["id"] for m in engine.recall("what did we decide yesterday", session_id="default")["memories"]] == [recent, old]
        assert engine.recall_rendered("what did we decide yesterday", session_id="default", time_boost=0.0).structured[
            "memories"][0]["id"] == old

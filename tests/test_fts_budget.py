"""Bounded BM25 work (tinycontext/retrieval/bounded_bm25.py): the commonest query words are set aside only when
the rows to score exceed the budget (they still score the rows kept); otherwise the query is fts_query's."""

from __future__ import annotations

import pytest
from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.retrieval.bounded_bm25 import COUNT, bounded_match
from tinycontext.retrieval.fusion import fts_query


def _engine(tmp_path, budget: int) -> MemoryEngine:
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", recall_fts_budget=budget)
    engine = MemoryEngine(config, embedder=HashEmbedder())
    # 60 memories: "common" in all, "usual" in 30, "middling" in 10, "rare" in 2.
    engine.save([" ".join(["common", f"note{i}"] + ["usual"] * (i % 2 == 0) + ["middling"] * (i % 6 == 0) + ["rare"] * (i in (5, 7)))
                 for i in range(60)], session_id="s")
    return engine


def test_commonest_words_dropped_past_the_budget(tmp_path):
    with _engine(tmp_path, 20) as engine:
        query = "rare common middling usual"
        assert bounded_match(engine.store, query, 20) == ('"rare" OR "middling"', '"common" OR "usual"')  # 2 + 10 rows; 60 and 30 aside
        assert bounded_match(engine.store, query, 45)[0] == '"rare" OR "middling" OR "usual"'
        assert bounded_match(engine.store, query, 1000)[0] == fts_query(query)  # fewer memories than the budget
        assert bounded_match(engine.store, query, 0) == (fts_query(query), None)  # no bound
        assert bounded_match(engine.store, "common usual", 5)[0] == '"usual"'  # the rarest word always stays
        assert bounded_match(engine.store, "common", 5)[0] == '"common"'
        assert bounded_match(engine.store, "the of", 5)[0] == fts_query("the of")
        hits = engine.candidate_search.bm25(query, "s", [], 100)
        contents = [engine.get(i)["content"] for i, _ in hits]
        assert len(hits) == 12 and all("middling" in c or "rare" in c for c in contents)


def test_words_set_aside_still_score_the_rows_kept(tmp_path):
    """Past the budget only rows holding a kept word are scored, but by the whole query: every hit has
    the unbounded search's score, in its order, also when the list is cut short."""
    with _engine(tmp_path, 20) as engine:
        query = "rare common middling usual"
        search = engine.candidate_search
        bounded = {depth: search.bm25(query, "s", [], depth) for depth in (3, 100)}
        search.config = engine.config.model_copy(update={"recall_fts_budget": 0})
        full = search.bm25(query, "s", [], 100)
        kept = [(i, score) for i, score in full if "rare" in engine.get(i)["content"] or "middling" in engine.get(i)["content"]]
        assert len(kept) == 12 and len(full) == 60
        for depth, hits in bounded.items():  # the same sums, up to the order FTS5 adds the phrases in
            assert [i for i, _ in hits] == [i for i, _ in kept[:depth]]
            assert [score for _, score in hits] == pytest.approx([score for _, score in kept[:depth]], rel=1e-12)


def test_under_the_budget_recall_is_unchanged(tmp_path):
    with _engine(tmp_path, 100) as bounded:
        query = "rare common middling usual"
        unbounded = MemoryEngine(bounded.config.model_copy(update={"recall_fts_budget": 0}), embedder=HashEmbedder())
        with unbounded:
            assert bounded.candidate_search.bm25(query, "s", [], 100) == unbounded.candidate_search.bm25(query, "s", [], 100)
            assert bounded.recall(query, session_id="s")["memories"] == unbounded.recall(query, session_id="s")["memories"]


def test_session_search_is_the_joined_search(tmp_path):
    """BM25 for one session of several runs on its id range, without the join when the range holds
    only its memories; it must return exactly what the plain join over all rows returns, also when
    sessions were saved interleaved."""
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        for chunk, session in enumerate(["a", "b", "a", "c", "c"]):
            engine.save([f"note {chunk} {i} {'apple' if i % 3 else 'pear'} {session}{i}" for i in range(8)], session_id=session)
        engine.save(["apple pear only"], session_id="d")  # a session saved in one call: its range is its own
        for session in ("a", "b", "c", "d"):
            for query in ("apple", "pear note", "apple 3"):
                plain = engine.candidate_search.bm25_hits(bounded_match(engine.store, query, 0)[0], [], session, None, [], None, 100)
                assert engine.candidate_search.bm25(query, session, [], 100) == plain
                assert plain and all(engine.get(i)["session_id"] == session for i, _ in plain)
        assert engine.candidate_search.mixed_sessions == {"a"}  # b lies inside a's range, c and d do not mix


def _counted(store, calls: list):
    """store.read, recording the word counts it runs."""
    read = store.read

    def counting(sql, params=()):
        if sql == COUNT:
            calls.append(params[0])
        return read(sql, params)
    return counting


def test_word_counts_are_kept_until_the_database_changes(tmp_path, monkeypatch):
    """The counts that choose the words set aside are kept between searches, and dropped by a write through
    this engine or another connection: a word that grew past the budget is then set aside."""
    with _engine(tmp_path, 20) as engine:
        counts, calls = engine.candidate_search.row_counts, []
        monkeypatch.setattr(engine.store, "read", _counted(engine.store, calls))
        query = "rare common middling usual"
        expected = ('"rare" OR "middling"', '"common" OR "usual"')
        assert bounded_match(engine.store, query, 20, counts=counts) == expected and len(calls) == 4
        assert bounded_match(engine.store, query, 20, counts=counts) == expected and len(calls) == 4  # kept
        assert engine.candidate_search.bm25(query, "s", [], 100)[:1] and len(calls) == 4  # the engine's search uses them
        extra = engine.save([f"middling extra{i}" for i in range(12)], session_id="s")["ids"]  # middling: 10 -> 22 rows
        assert bounded_match(engine.store, query, 20, counts=counts) == ('"rare"', '"common" OR "middling" OR "usual"')
        assert len(calls) == 8
        assert extra[-1] == engine.store.read("SELECT max(id) FROM memories")[0][0]
        other = MemoryEngine(engine.config, embedder=HashEmbedder())  # another connection to the same file
        with other:
            for memory_id in [i for i, in engine.store.read("SELECT id FROM memories WHERE content LIKE 'common%middling%'")][:6]:
                other.delete(memory_id)  # middling: 22 -> 16 rows, the highest id unchanged
        assert bounded_match(engine.store, query, 20, counts=counts) == expected and len(calls) == 12
        assert counts.count(["rare", "middling"], 1, 10**6, 1000) == [2, 16]


def test_word_counts_inside_a_write_are_not_kept(tmp_path):
    """Counts read inside a write transaction see its rows, which may roll back: they are never kept."""
    with _engine(tmp_path, 20) as engine:
        counts = engine.candidate_search.row_counts
        assert counts.count(["rare"], 1, 1000, 21) == [2]
        with pytest.raises(RuntimeError):
            with engine.store.write() as conn:
                conn.execute("INSERT INTO memories(session_id, content, content_hash, tokens, created_at) "
                             "SELECT session_id, 'rare again', 'h', 2, created_at FROM memories LIMIT 1")
                assert counts.count(["rare"], 1, 1000, 21) == [3]
                raise RuntimeError("roll back")
        assert counts.count(["rare"], 1, 1000, 21) == [2]

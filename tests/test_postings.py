"""The postings snapshot (tinycontext/retrieval/postings.py): the bounded BM25 scored with numpy from it gives FTS5's
list exactly, ids and floats, on real text, also after saves, updates and deletes since the build; where it cannot
(filters, tags, a session join, phrases, too many changes, no snapshot) the search is FTS5's; builds are all or
nothing."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import numpy as np
import pytest
from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.retrieval import language, postings
from tinycontext.retrieval.bounded_bm25 import RowCounts, bounded_match
from tinycontext.retrieval.filters import Filters


def _turns(shared_dir) -> tuple[list[str], list[str]]:
    data = json.loads((shared_dir / "datasets" / "locomo" / "locomo-dev.json").read_text(encoding="utf-8"))
    conv = data[0]["conversation"]
    turns = [f"{t['speaker']}: {t['text']}" for k in sorted((k for k in conv if re.fullmatch(r"session_\d+", k)),
                                                           key=lambda k: int(k.split("_")[1])) for t in conv[k]]
    return turns, [q["question"] for q in data[0]["qa"]][:60]


def _engine(tmp_path, turns: list[str], sessions: int = 1, budget: int = 60) -> MemoryEngine:
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", recall_fts_budget=budget)
    engine = MemoryEngine(config, embedder=HashEmbedder())
    step = -(-len(turns) // sessions)
    for s in range(sessions):
        engine.save([{"content": t, "tags": ["chat"] if i % 3 else []} for i, t in enumerate(turns[s * step:(s + 1) * step])],
                    session_id=f"s{s}")
    return engine


@contextmanager
def _counting(engine):
    """Counts the searches the snapshot answered (not None)."""
    search, used = engine.candidate_search.postings.bounded_scores, []

    def counted(*args, **kwargs):
        found = search(*args, **kwargs)
        used.extend([found is not None])
        return found
    engine.candidate_search.postings.bounded_scores = counted
    try:
        yield used
    finally:
        engine.candidate_search.postings.bounded_scores = search


def _fts5(engine, *args):
    """The same search through FTS5 alone."""
    search = engine.candidate_search.postings.bounded_scores
    engine.candidate_search.postings.bounded_scores = lambda *a, **k: None
    try:
        return engine.candidate_search.bm25(*args)
    finally:
        engine.candidate_search.postings.bounded_scores = search


def _same(engine, questions, session=None, tags=(), filters=None) -> int:
    """Asserts the snapshot's lists are FTS5's (ids and floats) for each question at two depths; returns how many
    searches the snapshot answered."""
    with _counting(engine) as used:
        for question in questions:
            for depth in (10, 100):
                got = engine.candidate_search.bm25(question, session, list(tags), depth, filters)
                assert got == _fts5(engine, question, session, list(tags), depth, filters)
    return sum(used)


def _same_counts(engine, questions) -> None:
    """The words kept and set aside with counts from the snapshot are those with FTS5's counts, for the whole table
    and for an id range; and the snapshot did count."""
    snapshot = engine.candidate_search.postings
    high = engine.store.read("SELECT max(id) FROM memories")[0][0]
    for span in (None, (40, high - 30)):
        for question in questions:
            want = bounded_match(engine.store, question, 60, span, RowCounts(engine.store))
            assert bounded_match(engine.store, question, 60, span, RowCounts(engine.store, snapshot)) == want
    assert snapshot.counts(["caroline", "support"], 40, high - 30, 10**6) == [
        engine.store.read("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH ? AND rowid BETWEEN 40 AND ?", (f'"{w}"', high - 30))[0][0]
        for w in ("caroline", "support")]


def test_snapshot_scores_are_fts5s_after_saves_updates_and_deletes(tmp_path, shared_dir):
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns[:300]) as engine:
        assert engine.candidate_search.postings.bounded_scores(["caroline"], ["the"], 10) is None  # no snapshot yet
        assert engine.stats()["bm25_postings"] is None
        assert engine.store.optimize(build_postings=True)["postings"]["changes"] == 0
        assert _same(engine, questions) > 60
        _same_counts(engine, questions)
        engine.save(turns[300:], session_id="s0")  # new rows since the build
        ids = [r[0] for r in engine.store.read("SELECT id FROM memories ORDER BY id")]
        for i in ids[10:280:7]:
            engine.update(i, content=turns[-1 - i % 100])  # other words, other lengths
        for i in ids[3:330:11]:
            engine.delete(i)
        engine.update(ids[-1], tags=["chat", "again"])  # a tags-only change re-scores the row too
        changed = engine.stats()["bm25_postings"]
        assert changed["changes"] > len(turns) - 300 and changed["used"]
        assert _same(engine, questions) > 60
        _same_counts(engine, questions)
        # A bm25 constant off by 1e-7 breaks the equality: the comparison sees the last bits of the scores.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(postings, "K1", postings.K1 + 1e-7)
            with pytest.raises(AssertionError):
                _same(engine, questions[:10])
        engine.store.optimize()  # rows changed: rebuilt, the changes start over
        assert engine.stats()["bm25_postings"]["changes"] == 0
        assert _same(engine, questions) > 60


def test_below_the_budget_the_whole_query_is_scored_from_the_snapshot(tmp_path, shared_dir):
    """A store whose rows fit the budget searches the whole OR query (no word set aside): from the snapshot too, with
    FTS5's ids and floats, one-word queries included, before and after changes since the build."""
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns[:300], budget=10**6) as engine:
        engine.store.optimize(build_postings=True)
        words = ["caroline", "adoption", "painting"]
        assert _same(engine, questions + words) == 2 * (len(questions) + len(words))  # every search, both depths
        engine.save(turns[300:], session_id="s0")
        engine.update(5, content=turns[-1])
        assert _same(engine, questions + words) == 2 * (len(questions) + len(words))


def test_union_and_best_are_numpys():
    """The rows holding a kept word (np.unique of the lists) and the best of them (np.lexsort by score, then row),
    ties at the cut included, from their faster forms."""
    rng = np.random.default_rng(5)
    for sizes in ([], [0], [7], [300, 0, 120, 5]):
        lists = [np.sort(rng.choice(1000, size, replace=False)).astype(np.int64) for size in sizes] or [np.zeros(0, np.int64)]
        assert np.array_equal(postings._union(lists), np.unique(np.concatenate(lists)))
    rows = rng.permutation(500).astype(np.int64)
    score = rng.integers(0, 20, 500) * 0.5  # many ties
    for depth in (1, 10, 100, 499, 500, 600):
        assert postings._best(rows, score, depth).tolist() == np.lexsort((rows, -score))[:depth].tolist()


def test_decoded_lists_are_kept_within_their_budget(tmp_path, shared_dir, monkeypatch):
    """Each word's snapshot list is decoded once and kept (searches read a list twice, and questions share words):
    the same searches again read no list from the database; past LISTS_CACHE_BYTES the least recently used lists
    go; the lists stay FTS5's either way."""
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns) as engine:
        engine.store.optimize(build_postings=True)
        assert _same(engine, questions[:20]) > 20
        state = engine.candidate_search.postings._snapshot
        state.lists.clear()
        state.lists_bytes = 0
        reads = []
        for conn in [engine.store.conn, *engine.store._readers]:
            conn.set_trace_callback(lambda sql: reads.append(sql) if "FROM memory_postings WHERE" in sql else None)
        assert _same(engine, questions[:20]) > 20
        assert reads and state.lists_bytes == sum(rows.nbytes + freqs.nbytes for rows, freqs in state.lists.values())
        del reads[:]
        assert _same(engine, questions[:20]) > 20
        assert not reads
        monkeypatch.setattr(postings, "LISTS_CACHE_BYTES", 1)
        assert _same(engine, questions[20:40]) > 20
        assert reads and len(state.lists) == 1


def test_filters_tags_joins_and_phrases_search_through_fts5(tmp_path, shared_dir):
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns, sessions=3) as engine:
        engine.store.optimize(build_postings=True)
        assert _same(engine, questions, tags=["chat"]) == 0
        assert _same(engine, questions, filters=Filters(tags_any=("chat",))) == 0
        # A session whose id range is its own: searched on the range, from the snapshot.
        assert _same(engine, questions, session="s1") > 60
        engine.save(["Caroline went to the support group in s1's range? no: after every session"], session_id="s0")
        # s0's range now spans s1 and s2: the first search's hits there mark it mixed, and the join (FTS5) takes over.
        assert _same(engine, questions, session="s0") == 1
        assert "s0" in engine.candidate_search.mixed_sessions
        assert _same(engine, ["what did caroline_research say about the adoption agencies"]) == 0  # "caroline research": a phrase


def test_too_many_changes_fall_back_until_the_next_build(tmp_path, shared_dir, monkeypatch):
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns[:300]) as engine:
        engine.store.optimize(build_postings=True)
        monkeypatch.setattr(postings, "MAX_CHANGES", 20)
        engine.save(turns[300:315], session_id="s0")
        engine.update(1, content=turns[-1])  # one change for an update
        assert engine.stats()["bm25_postings"] == {**engine.stats()["bm25_postings"], "changes": 16, "used": True}
        engine.save(turns[315:330], session_id="s0")
        assert engine.stats()["bm25_postings"]["used"] is False
        assert _same(engine, questions) == 0
        assert engine.store.optimize()["postings"] == {**engine.stats()["bm25_postings"], "changes": 0, "used": True}
        assert _same(engine, questions) > 60


def test_a_failed_build_keeps_the_snapshot_there_was(tmp_path, shared_dir, monkeypatch):
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns[:300]) as engine:
        engine.store.optimize(build_postings=True)
        before = engine.stats()["bm25_postings"]
        engine.save(turns[300:], session_id="s0")
        rows = engine.store.read("SELECT count(*), sum(length(rows)) FROM memory_postings")[0]
        unique, calls = np.unique, []

        def failing(*args, **kwargs):  # the 100th token's postings: part of the table is written
            calls.append(1)
            if len(calls) == 100:
                raise MemoryError("out of memory")
            return unique(*args, **kwargs)
        monkeypatch.setattr(postings.np, "unique", failing)
        with pytest.raises(MemoryError):
            engine.store.optimize()
        monkeypatch.undo()
        assert engine.store.read("SELECT count(*), sum(length(rows)) FROM memory_postings")[0] == rows
        assert engine.stats()["bm25_postings"] == {**before, "changes": engine.stats()["bm25_postings"]["changes"]}
        assert _same(engine, questions) > 60


def test_without_a_snapshot_nothing_changes(tmp_path, shared_dir):
    """Stores below MIN_MEMORIES get no snapshot from optimize; after a tokenizer switch the snapshot of the old
    tokens is not used until optimize rebuilds it, and the trigram tokenizer never has one."""
    turns, questions = _turns(shared_dir)
    with _engine(tmp_path, turns[:300]) as engine:
        assert engine.store.optimize()["postings"] is None
        assert not postings.wanted(engine.store.conn)
        engine.store.optimize(build_postings=True)
        assert not postings.wanted(engine.store.conn)
        assert language.set_tokenizer(engine.store, "unicode61")
        assert engine.stats()["bm25_postings"]["used"] is False and postings.wanted(engine.store.conn)
        assert _same(engine, questions) == 0
        assert engine.store.optimize()["postings"]["used"]
        assert _same(engine, questions) > 60
        assert language.set_tokenizer(engine.store, "trigram")
        engine.store.optimize()
        assert engine.stats()["bm25_postings"] is None
        assert not engine.store.read("SELECT name FROM sqlite_master WHERE name LIKE 'memory_postings%'")
        engine.save(["still saved"], session_id="s0")
        assert engine.stats()["memories"] == 301


def test_migration_drops_the_snapshot(tmp_path, shared_dir):
    turns, _ = _turns(shared_dir)
    with _engine(tmp_path, turns[:100]) as engine:
        engine.store.optimize(build_postings=True)
        version = engine.store.schema_version
        with engine.store.write() as conn:
            conn.execute(f"PRAGMA user_version = {version - 1}")
        engine.store.migrate()
        assert engine.store.schema_version == version and engine.stats()["bm25_postings"] is None

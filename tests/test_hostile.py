"""Hostile inputs: generated queries never raise anything but TinyContextError and never break
later queries; malformed saves fail with a typed error and leave the stored data unchanged."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import suite_embedder
from tinycontext import MemoryEngine, TinyContextConfig, TinyContextError

FTS_SYNTAX = ['"', "'", "*", "^", ":", "(", ")", "{", "}", "-", "+", "?", "NEAR", "NEAR(", "AND", "OR", "NOT",
              "content:", "tags:", "\x00", "\\", "é", "日本語", "🙂", "\ud800", "_", "%", "'; DROP TABLE memories; --"]
SEED = [
    {"content": "The quarterly report is due on Friday", "tags": ["work"]},
    {"content": "Café meetup at 日本語 school near the station", "tags": ["social", "é"]},
    {"content": "NEAR AND OR NOT are FTS5 keywords", "metadata": {"kind": "doc"}},
]

queries = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(FTS_SYNTAX)), min_size=1, max_size=8).map(" ".join)


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile")
    config = TinyContextConfig(memory_db_path=path / "m.db", models_dir=path / "models", max_content_chars=10_000, max_batch_size=20)
    with MemoryEngine(config, embedder=suite_embedder()) as engine:
        engine.save(SEED, session_id="s")
        yield engine


def snapshot(engine: MemoryEngine) -> tuple:
    read = engine.store.read
    return (read("SELECT id, session_id, content, tags, metadata, content_hash, tokens, version FROM memories ORDER BY id"),
            read("SELECT count(*) FROM memories_fts")[0][0], read("SELECT count(*) FROM memory_vectors")[0][0],
            read("SELECT memory_id, tag FROM memory_tags ORDER BY memory_id, tag"), read("SELECT count(*) FROM memory_versions")[0][0],
            read("SELECT id FROM sessions ORDER BY id"))


def still_works(engine: MemoryEngine) -> None:
    out = engine.recall("quarterly report Friday", session_id="s", top_k=1)
    assert out["memories"][0]["content"] == SEED[0]["content"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries, weight=st.sampled_from([0.0, 0.5, 1.0]),
       tags=st.one_of(st.none(), st.lists(st.one_of(st.text(max_size=5), st.sampled_from(FTS_SYNTAX)), max_size=3)),
       session=st.sampled_from([None, "s", "missing"]))
def test_generated_queries_only_raise_typed_errors(eng, query, weight, tags, session):
    try:
        out = eng.recall(query, dense_weight=weight, tags=tags, session_id=session)
    except TinyContextError as exc:
        assert exc.code != "internal_error" and exc.message
    else:
        assert out["total_tokens"] <= out["max_tokens"]
        assert all(m["session_id"] == "s" for m in out["memories"])
    still_works(eng)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.text(min_size=1, max_size=200), tags=st.lists(st.text(max_size=8), max_size=3))
def test_generated_saves_round_trip_or_fail_cleanly(eng, content, tags):
    before = snapshot(eng)
    try:
        out = eng.save([{"content": content, "tags": tags}], session_id="gen")
    except TinyContextError as exc:
        assert exc.code in {"invalid_input", "empty_memory"} and exc.message
        assert snapshot(eng) == before
        return
    for mid in out["ids"]:
        memory = eng.get(mid)
        assert memory["content"] == content.strip()
        assert memory["tags"] == list(dict.fromkeys(t.strip() for t in tags))
        eng.delete(mid)
    still_works(eng)


def deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


BAD_SAVES = [
    ([], "empty_memory"),
    ([""], "empty_memory"),
    (["  \n\t  "], "empty_memory"),
    # Whitespace of other scripts and invisible format characters show nothing either (issue 19).
    (["\u3000\u200b"], "empty_memory"),
    (["\u00a0\u2028\u2029\u202f\u205f\ufeff\u2060\u200c\u200d\u00ad\u180e\u3164"], "empty_memory"),
    ([{"content": ""}], "empty_memory"),
    (["a\x00b"], "invalid_input"),
    (["lone \ud800 surrogate"], "invalid_input"),
    (["\udfff"], "invalid_input"),
    ([123], "invalid_input"),
    ([None], "invalid_input"),
    ([["nested", "list"]], "invalid_input"),
    (None, "invalid_input"),
    (5, "invalid_input"),
    ([{"content": 5}], "invalid_input"),
    ([{"text": "wrong key"}], "invalid_input"),
    ([{"content": "x", "extra": 1}], "invalid_input"),
    ([{1: "non-string key"}], "invalid_input"),
    ([{"content": "x", "tags": "notalist"}], "invalid_input"),
    ([{"content": "x", "tags": [1, 2]}], "invalid_input"),
    ([{"content": "x", "tags": [""]}], "invalid_input"),
    ([{"content": "x", "tags": ["t\x00"]}], "invalid_input"),
    ([{"content": "x", "tags": ["\ud800"]}], "invalid_input"),
    ([{"content": "x", "tags": ["t" * 101]}], "invalid_input"),
    ([{"content": "x", "tags": [f"t{i}" for i in range(65)]}], "invalid_input"),
    ([{"content": "x", "metadata": "not a dict"}], "invalid_input"),
    ([{"content": "x", "metadata": [1, 2]}], "invalid_input"),
    ([{"content": "x", "metadata": {"s": {1, 2}}}], "invalid_input"),
    ([{"content": "x", "metadata": {"n": float("nan")}}], "invalid_input"),
    ([{"content": "x", "metadata": {"n": float("inf")}}], "invalid_input"),
    ([{"content": "x", "metadata": {"o": object()}}], "invalid_input"),
    ([{"content": "x", "metadata": {"b": b"bytes"}}], "invalid_input"),
    ([{"content": "x", "metadata": {"s": "\ud800"}}], "invalid_input"),
    ([{"content": "x", "metadata": deep(17)}], "invalid_input"),
    ([{"content": "x", "metadata": deep(5000)}], "invalid_input"),
    ([{"content": "x", "metadata": {"big": "x" * 70_000}}], "invalid_input"),
    (["x" * 1_000_000], "invalid_input"),
    (["x" * 10_001], "invalid_input"),
    ([f"batch item {i}" for i in range(21)], "invalid_input"),
    (["a valid memory", "b\x00 invalid one"], "invalid_input"),  # one bad item rejects the whole batch
    (["a valid memory", ""], "empty_memory"),
]


@pytest.mark.parametrize("memories,code", BAD_SAVES, ids=[f"{i}-{c}" for i, (_, c) in enumerate(BAD_SAVES)])
def test_bad_saves_fail_typed_and_change_nothing(eng, memories, code):
    before = snapshot(eng)
    with pytest.raises(TinyContextError) as err:
        eng.save(memories, session_id="s")
    assert err.value.code == code
    assert err.value.message and len(err.value.message) < 2000
    assert err.value.to_dict()["code"] == code
    assert snapshot(eng) == before
    still_works(eng)


@pytest.mark.parametrize("session", ["", "   ", 5, "x" * 201, "a\x00b", "\ud800", ["s"]])
def test_bad_session_ids(eng, session):
    before = snapshot(eng)
    with pytest.raises(TinyContextError) as err:
        eng.save(["valid content"], session_id=session)
    assert err.value.code == "invalid_input"
    assert snapshot(eng) == before


@pytest.mark.parametrize("change", [
    {"content": ""}, {"content": "a\x00"}, {"content": "x" * 10_001}, {"tags": "str"}, {"tags": [None]},
    {"metadata": {"n": float("nan")}}, {"metadata": deep(100)}, {"metadata": "str"},
])
def test_bad_updates_change_nothing(eng, change):
    mid = eng.store.read("SELECT min(id) FROM memories")[0][0]
    before = snapshot(eng)
    with pytest.raises(TinyContextError) as err:
        eng.update(mid, **change)
    assert err.value.code in {"invalid_input", "empty_memory"}
    assert snapshot(eng) == before


def test_valid_unusual_content_round_trips(eng):
    texts = ["日本語のメモ 🙂", "emoji only 🙂🙂🙂", "quotes \" ' and `backticks`", "SQL '; DROP TABLE memories; --",
             "NEAR(a b) AND c* ^d e:f", "tab\tand\nnewline", "<|endoftext|>", "\u200b zero width", "combining cafe\u0301"]
    ids = eng.save(texts, session_id="unusual")["ids"]
    assert [eng.get(i)["content"] for i in ids] == texts
    for text, mid in zip(texts, ids):
        out = eng.recall(text, session_id="unusual", top_k=len(texts), max_tokens=100_000)
        assert mid in [m["id"] for m in out["memories"]]
    for mid in ids:
        eng.delete(mid)
    still_works(eng)

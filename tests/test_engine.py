"""MemoryEngine end to end on real SQLite: save/recall/get/update/delete, sessions, tags, dedup,
budgets and paging, fusion weights, and a relevance smoke test with the real MiniLM model."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import HashEmbedder
from tinycontext import (
    InvalidInputError,
    MemoryEngine,
    MemoryInput,
    MemoryNotFoundError,
    RecallBudgetError,
    SessionNotFoundError,
    close_engines,
    delete_memory,
    get_memory,
    recall_memories,
    save_memories,
    update_memory,
)
from tinycontext.retrieval.fusion import fts_query
from tinycontext.memory.store import SCHEMA_VERSION

FACTS = [
    "The deploy script lives in ops/deploy.sh and needs the staging token.",
    "Alice prefers dark mode and Vim keybindings in every editor.",
    "The database backup runs nightly at 02:00 UTC to the cold bucket.",
    "Bob is allergic to peanuts; order the sesame-free menu for him.",
    "Release 2.3 shipped the new search ranking with reciprocal rank fusion.",
]


def ids_of(result: dict) -> list[int]:
    return [m["id"] for m in result["memories"]]


def fts_hits(engine: MemoryEngine, word: str) -> set[int]:
    return {r[0] for r in engine.store.read("SELECT rowid FROM memories_fts WHERE memories_fts MATCH ?", (fts_query(word),))}


def stored_vector(engine: MemoryEngine, memory_id: int) -> np.ndarray | None:
    rows = engine.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = ?", (memory_id,))
    return np.frombuffer(rows[0][0], np.float32) if rows else None


# -- save / get ---------------------------------------------------------------------------------

def test_save_and_get_round_trip(hash_engine):
    out = hash_engine.save([{"content": "  Alice likes tea.  ", "tags": [" drinks ", "alice", "drinks"], "metadata": {"src": "chat", "n": [1, 2]}}],
                           session_id="s1")
    assert out["session_id"] == "s1" and len(out["ids"]) == 1 and out["skipped"] == []
    mid = out["ids"][0]
    memory = hash_engine.get(mid)
    assert memory["content"] == "Alice likes tea."
    assert memory["tags"] == ["drinks", "alice"]
    assert memory["metadata"] == {"src": "chat", "n": [1, 2]}
    assert memory["session_id"] == "s1" and memory["version"] == 1 and memory["history"] == []
    assert memory["tokens"] == hash_engine.tokens.count("Alice likes tea.") == out["total_tokens"] == out["saved"][0]["tokens"]
    assert memory["created_at"] == memory["updated_at"]
    assert np.allclose(stored_vector(hash_engine, mid), hash_engine.embedder.embed_documents(["Alice likes tea."])[0])
    assert {r[0] for r in hash_engine.store.read("SELECT tag FROM memory_tags WHERE memory_id = ?", (mid,))} == {"drinks", "alice"}


def test_save_accepts_strings_dicts_and_models(hash_engine):
    out = hash_engine.save(["one string", {"content": "a dict"}, MemoryInput(content="a model", tags=["t"])])
    assert [hash_engine.get(i)["content"] for i in out["ids"]] == ["one string", "a dict", "a model"]
    assert hash_engine.save("single string")["ids"]


def test_session_none_saves_to_default(hash_engine):
    out = hash_engine.save(["goes to default"])
    assert out["session_id"] == "default"
    assert hash_engine.get(out["ids"][0])["session_id"] == "default"
    assert [s["session_id"] for s in hash_engine.sessions()] == ["default"]


def test_stats_and_sessions(hash_engine):
    hash_engine.save(FACTS[:3], session_id="a")
    hash_engine.save(FACTS[3:], session_id="b")
    stats = hash_engine.stats()
    assert stats["memories"] == stats["vectors"] == len(FACTS)
    assert stats["sessions"] == 2 and stats["schema_version"] == SCHEMA_VERSION
    assert stats["embedder"] == hash_engine.embedder.identity
    assert stats["tokens"] == sum(hash_engine.tokens.count(f) for f in FACTS)
    assert {s["session_id"]: s["memories"] for s in hash_engine.sessions()} == {"a": 3, "b": 2}


def test_stats_counts_sessions_from_the_sessions_index_not_every_memory(hash_engine, monkeypatch):
    hash_engine.save(FACTS[:2], session_id="a")
    hash_engine.ensure_session("empty")  # a session without memories counts, as list_sessions shows it
    statements = []
    read = hash_engine.store.read
    monkeypatch.setattr(hash_engine.store, "read", lambda sql, params=(): statements.append(sql) or read(sql, params))
    stats = hash_engine.stats()
    monkeypatch.undo()
    assert stats["sessions"] == 2 == len(hash_engine.sessions())
    [counted] = [sql for sql in statements if "sessions" in sql]
    plan = " ".join(row[-1] for row in read("EXPLAIN QUERY PLAN " + counted))
    assert "COVERING INDEX" in plan and "memories" not in counted and "GROUP BY" not in counted.upper()


# -- update / delete ----------------------------------------------------------------------------

def test_update_keeps_history_and_moves_fts_and_vector(hash_engine):
    mid = hash_engine.save([{"content": "The meeting is on Tuesday with marketing", "tags": ["work"]}])["ids"][0]
    before = hash_engine.get(mid)
    updated = hash_engine.update(mid, "The standup moved to Thursday", tags=["calendar"], metadata={"edited": True})
    assert updated["content"] == "The standup moved to Thursday" and updated["version"] == 2
    assert updated["tags"] == ["calendar"] and updated["metadata"] == {"edited": True}
    assert updated["created_at"] == before["created_at"] and updated["updated_at"] > before["updated_at"]
    [old] = updated["history"]
    assert old["version"] == 1 and old["content"] == before["content"] and old["tags"] == ["work"] and old["metadata"] == {}
    assert old["created_at"] == before["updated_at"] and old["superseded_at"] == updated["updated_at"]
    assert updated["tokens"] == hash_engine.tokens.count("The standup moved to Thursday")
    # FTS follows: old words no longer match, new ones do.
    assert mid not in fts_hits(hash_engine, "marketing") and mid not in fts_hits(hash_engine, "Tuesday")
    assert mid in fts_hits(hash_engine, "Thursday")
    assert ids_of(hash_engine.recall("marketing Tuesday", dense_weight=0.0)) == []
    assert ids_of(hash_engine.recall("standup Thursday", dense_weight=0.0)) == [mid]
    # The vector follows the new content.
    assert np.allclose(stored_vector(hash_engine, mid), hash_engine.embedder.embed_documents([updated["content"]])[0])
    # Tags follow.
    assert ids_of(hash_engine.recall("standup", tags=["calendar"])) == [mid]
    with pytest.raises(SessionNotFoundError):
        hash_engine.recall("standup", session_id="work")
    assert ids_of(hash_engine.recall("standup", tags=["work"])) == []


def test_update_metadata_only_keeps_content_and_vector(hash_engine):
    mid = hash_engine.save([{"content": "keep this text", "tags": ["x"]}])["ids"][0]
    vector = stored_vector(hash_engine, mid)
    out = hash_engine.update(mid, metadata={"k": 1})
    assert (out["content"], out["tags"], out["metadata"], out["version"]) == ("keep this text", ["x"], {"k": 1}, 2)
    assert np.array_equal(stored_vector(hash_engine, mid), vector)
    out = hash_engine.update(mid, "third text")
    assert [h["version"] for h in out["history"]] == [1, 2] and out["version"] == 3 and out["metadata"] == {"k": 1}


def test_update_rejects_bad_input_and_keeps_memory(hash_engine):
    mid = hash_engine.save(["original"])["ids"][0]
    for bad in ({"content": "  "}, {"content": "a\x00b"}, {"tags": "notalist"}, {"metadata": {"x": {1, 2}}}):
        with pytest.raises(InvalidInputError):
            hash_engine.update(mid, **bad)
    memory = hash_engine.get(mid)
    assert (memory["content"], memory["version"], memory["history"]) == ("original", 1, [])


def test_delete_removes_everywhere(hash_engine):
    keep, gone = hash_engine.save([{"content": "keep the zebra", "tags": ["t"]}, {"content": "remove the giraffe", "tags": ["t"]}])["ids"]
    hash_engine.update(gone, "remove the okapi")
    assert hash_engine.delete(gone) == {"id": gone, "deleted": True}
    with pytest.raises(MemoryNotFoundError):
        hash_engine.get(gone)
    with pytest.raises(MemoryNotFoundError):
        hash_engine.delete(gone)
    with pytest.raises(MemoryNotFoundError):
        hash_engine.update(gone, "x")
    assert fts_hits(hash_engine, "okapi") == set() and fts_hits(hash_engine, "remove") == set()
    assert stored_vector(hash_engine, gone) is None
    for table in ("memory_tags", "memory_versions"):
        assert hash_engine.store.read(f"SELECT count(*) FROM {table} WHERE memory_id = ?", (gone,))[0][0] == 0
    assert all(gone not in ids_of(hash_engine.recall(q, dense_weight=w)) for q in ("remove okapi", "the") for w in (0, 0.5, 1))
    assert hash_engine.get(keep)["content"] == "keep the zebra"
    assert hash_engine.stats()["memories"] == hash_engine.stats()["vectors"] == 1


@pytest.mark.parametrize("bad", ["abc", None, True, 1.5j, [1]])
def test_bad_ids_are_invalid_input(hash_engine, bad):
    for call in (hash_engine.get, hash_engine.delete):
        with pytest.raises(InvalidInputError):
            call(bad)


@pytest.mark.parametrize("missing", [0, -1, 999, 2**70])
def test_missing_ids_are_not_found(hash_engine, missing):
    hash_engine.save(["something"])
    with pytest.raises(MemoryNotFoundError):
        hash_engine.get(missing)
    with pytest.raises(MemoryNotFoundError):
        hash_engine.delete(missing)


# -- sessions and tags --------------------------------------------------------------------------

QUERIES = ["secret plans", "the", "alpha beta", "🙂", "nothing in common xyz", "plans for bravo"]


def test_sessions_isolate(hash_engine):
    a = set(hash_engine.save(["secret plans for alpha", "the alpha beta notes"], session_id="A")["ids"])
    b = set(hash_engine.save(["secret plans for bravo", "the bravo beta notes"], session_id="B")["ids"])
    for query in QUERIES:
        for weight in (0.0, 0.5, 1.0):
            assert set(ids_of(hash_engine.recall(query, session_id="A", dense_weight=weight, top_k=50))) <= a
            assert set(ids_of(hash_engine.recall(query, session_id="B", dense_weight=weight, top_k=50))) <= b
    # Without a session every session is searched.
    assert set(ids_of(hash_engine.recall("secret plans beta notes", top_k=50))) == a | b
    with pytest.raises(SessionNotFoundError) as err:
        hash_engine.recall("plans", session_id="C")
    assert err.value.code == "session_not_found" and "without session_id" in err.value.message


def test_near_duplicate_check_is_per_session(hash_engine):
    hash_engine.save(["exactly the same"], session_id="A")
    out = hash_engine.save(["exactly the same"], session_id="B")
    assert out["ids"] and out["skipped"] == [] and out["near_duplicates"] == []


def test_tag_filter_any_of_on_both_sides(hash_engine):
    ids = hash_engine.save([
        {"content": "red apple pie recipe", "tags": ["food", "red"]},
        {"content": "red sports car", "tags": ["cars", "red"]},
        {"content": "green apple tart recipe", "tags": ["food"]},
        {"content": "apple pie without tags"},
    ])["ids"]
    for weight in (0.0, 0.5, 1.0):
        assert set(ids_of(hash_engine.recall("red apple recipe", tags=["food"], dense_weight=weight, score_cliff=0.0))) == {ids[0], ids[2]}
        assert set(ids_of(hash_engine.recall("red apple recipe car", tags=["cars", "nope"], dense_weight=weight, score_cliff=0.0))) == {ids[1]}
        assert set(ids_of(hash_engine.recall("apple red", tags=["food", "cars"], dense_weight=weight, score_cliff=0.0))) == set(ids[:3])
        assert ids_of(hash_engine.recall("apple", tags=["unknown"], dense_weight=weight)) == []


# -- duplicates ---------------------------------------------------------------------------------

def test_exact_duplicates_skipped(hash_engine):
    first = hash_engine.save(["Alice likes  tea."])["ids"][0]
    out = hash_engine.save(["Alice likes tea.", "  Alice   likes tea.  ", "new fact", "new fact", "cafe\u0301 au lait", "café au lait"])
    skipped = {s["index"]: s for s in out["skipped"]}
    assert skipped[0] == {"index": 0, "reason": "duplicate", "duplicate_of": first}
    assert skipped[1]["duplicate_of"] == first
    new_fact = out["saved"][0]["id"]
    assert out["saved"][0]["index"] == 2 and skipped[3] == {"index": 3, "reason": "duplicate", "duplicate_of": new_fact}
    assert skipped[5]["reason"] == "duplicate"  # NFC-equal to index 4
    assert [s["index"] for s in out["saved"]] == [2, 4]
    assert hash_engine.stats()["memories"] == 3


def test_near_duplicates_reported_by_default(hash_engine):
    first = hash_engine.save(["The cat sat on the mat"])["ids"][0]
    out = hash_engine.save(["the cat sat on the mat!", "something else entirely"])
    assert len(out["ids"]) == 2 and out["skipped"] == []
    [near] = out["near_duplicates"]
    assert near["index"] == 0 and near["similar_to"] == first and near["similarity"] >= hash_engine.config.dedup_threshold
    # Within one batch too.
    out = hash_engine.save(["dogs bark loudly", "Dogs bark loudly!"])
    assert len(out["ids"]) == 2 and out["near_duplicates"][0]["similar_to"] == out["ids"][0]


def test_near_duplicates_skipped_in_skip_mode(config):
    with MemoryEngine(config.model_copy(update={"dedup_mode": "skip"}), embedder=HashEmbedder()) as eng:
        first = eng.save(["The cat sat on the mat"])["ids"][0]
        out = eng.save(["the cat sat on the mat!", "a different memory"])
        assert len(out["ids"]) == 1
        [skip] = out["skipped"]
        assert skip["reason"] == "near_duplicate" and skip["similar_to"] == first and skip["index"] == 0
        assert eng.stats()["memories"] == 2


# -- budget and paging --------------------------------------------------------------------------

def test_long_memory_does_not_hide_shorter_ones(hash_engine):
    long_text = "orchard apple harvest " + " ".join(f"filler{i}" for i in range(400))
    long_id, *short = hash_engine.save([long_text] + [f"orchard apple note {i}" for i in range(3)])["ids"]
    full = hash_engine.recall("orchard apple harvest", max_tokens=100_000, dense_weight=0.0, score_cliff=0.0)
    assert ids_of(full)[0] == long_id  # only it has "harvest": ranked first
    out = hash_engine.recall("orchard apple harvest", max_tokens=60, dense_weight=0.0, score_cliff=0.0)
    assert ids_of(out) == ids_of(full)[1:]
    assert out["truncated"] is True
    assert out["omitted"] == [{"id": long_id, "rank": 1, "tokens": hash_engine.get(long_id)["tokens"]}]
    assert out["omitted"][0]["tokens"] > 60
    assert out["total_tokens"] <= 60 and out["next_offset"] is None
    assert [m["rank"] for m in out["memories"]] == [2, 3, 4]


def test_paging_with_offset_gets_the_rest(hash_engine):
    texts = [f"project phoenix status update number {i} " + "detail " * (i % 4) for i in range(12)]
    hash_engine.save(texts)
    full = hash_engine.recall("project phoenix status", top_k=100, max_tokens=100_000)
    assert len(full["memories"]) == 12 and full["next_offset"] is None and not full["truncated"]
    budget = 3 * max(m["tokens"] for m in full["memories"])
    seen, omitted, offset, pages = [], [], 0, 0
    while offset is not None:
        pages += 1
        assert pages <= 12
        page = hash_engine.recall("project phoenix status", top_k=4, max_tokens=budget, offset=offset)
        assert page["total_tokens"] <= budget and len(page["memories"]) <= 4
        assert page["total_tokens"] == sum(m["tokens"] for m in page["memories"])
        seen += ids_of(page)
        omitted += [o["id"] for o in page["omitted"]]
        offset = page["next_offset"]
    assert pages > 1
    assert len(seen) == len(set(seen))
    assert set(seen) | set(omitted) == set(ids_of(full))
    # Paging keeps the full ranking's order.
    assert seen == [i for i in ids_of(full) if i in seen]


def test_budget_exhaustion_pages_instead_of_dropping(hash_engine):
    hash_engine.save([f"budget item {i} " + "word " * 20 for i in range(6)])
    one = hash_engine.tokens.count("budget item 0 " + "word " * 20)
    page = hash_engine.recall("budget item", max_tokens=2 * one + 1, top_k=10, dense_weight=0.0)
    assert len(page["memories"]) == 2 and page["omitted"] == []
    assert page["truncated"] is True and page["next_offset"] == 2
    rest = hash_engine.recall("budget item", max_tokens=100_000, top_k=10, dense_weight=0.0, offset=page["next_offset"])
    assert len(rest["memories"]) == 4 and [m["rank"] for m in rest["memories"]] == [3, 4, 5, 6]


def test_top_k_limit_sets_next_offset_but_not_truncated(hash_engine):
    hash_engine.save([f"limit test {i}" for i in range(5)])
    page = hash_engine.recall("limit test", top_k=2)
    assert len(page["memories"]) == 2 and page["next_offset"] == 2 and page["truncated"] is False


def test_special_token_text_is_ordinary(hash_engine):
    text = "The model stops at <|endoftext|> and <|endofprompt|> markers"
    mid = hash_engine.save([text])["ids"][0]
    tokens = len(hash_engine.tokens.encoding.encode_ordinary(text))
    assert hash_engine.get(mid)["tokens"] == tokens
    out = hash_engine.recall("<|endoftext|> markers")
    assert ids_of(out) == [mid] and out["total_tokens"] == tokens


@pytest.mark.parametrize("bad", [0, -5, 1_000_001, 10**30, 2.5, "100", True, [], float("nan")])
def test_bad_max_tokens_is_recall_budget(hash_engine, bad):
    hash_engine.save(["x y"])
    with pytest.raises(RecallBudgetError) as err:
        hash_engine.recall("x", max_tokens=bad)
    assert err.value.code == "recall_budget"


@pytest.mark.parametrize("name,bad", [
    ("top_k", 0), ("top_k", -1), ("top_k", 1001), ("top_k", "5"), ("top_k", 2.0), ("top_k", True),
    ("offset", -1), ("offset", "1"), ("offset", 10**30),
    ("dense_weight", -0.1), ("dense_weight", 1.5), ("dense_weight", "x"), ("dense_weight", float("nan")),
    ("rrf_k", -1), ("rrf_k", float("inf")), ("rrf_k", "60"),
    ("candidates", 0), ("candidates", 10**6), ("candidates", "x"),
    ("tags", "food"), ("tags", [1]), ("tags", [""]), ("tags", ["a\x00"]), ("tags", {"a": 1}),
    ("session_id", ""), ("session_id", 5), ("session_id", "x" * 500),
])
def test_bad_recall_arguments_are_invalid_input(hash_engine, name, bad):
    hash_engine.save(["x y"])
    with pytest.raises(InvalidInputError) as err:
        hash_engine.recall("x", **{name: bad})
    assert err.value.code == "invalid_input" and name.split("_")[0] in err.value.message


@pytest.mark.parametrize("query", ["", "   ", None, 42, "a\x00b", "\ud800"])
def test_bad_queries_are_invalid_input(hash_engine, query):
    with pytest.raises(InvalidInputError):
        hash_engine.recall(query)


def test_deep_paging_beyond_the_vector_index_limit(hash_engine):
    hash_engine.save([f"deep page {i}" for i in range(5)])
    assert hash_engine.recall("deep page", offset=5000)["memories"] == []
    assert len(hash_engine.recall("deep page", candidates=10_000)["memories"]) == 5


# -- fusion -------------------------------------------------------------------------------------

def test_weights_zero_and_one_reproduce_single_lists(hash_engine):
    hash_engine.save(FACTS + ["database token staging backup", "editor search ranking dark"])
    query = "database backup staging token search"
    bm25_order = [r[0] for r in hash_engine.store.read(
        "SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? ORDER BY bm25(memories_fts, 1.0, 0.5), rowid", (fts_query(query),))]
    rows = hash_engine.store.read("SELECT id, content FROM memories ORDER BY id")
    sims = hash_engine.embedder.embed_documents([r[1] for r in rows]) @ hash_engine.embedder.embed_query(query)
    dense_order = [rows[i][0] for i in sorted(range(len(rows)), key=lambda i: (-round(float(sims[i]), 5), rows[i][0]))]

    lexical = hash_engine.recall(query, dense_weight=0.0, top_k=50, score_cliff=0.0)
    assert ids_of(lexical) == bm25_order
    assert all(m["scores"]["dense"] is None and m["scores"]["bm25"] > 0 for m in lexical["memories"])
    k = hash_engine.config.recall_rrf_k
    assert [m["scores"]["rrf"] for m in lexical["memories"]] == pytest.approx([1 / (k + r) for r in range(1, len(bm25_order) + 1)])

    semantic = hash_engine.recall(query, dense_weight=1.0, top_k=50, min_dense=0.0, score_cliff=0.0)  # every neighbour, however weak
    assert ids_of(semantic) == dense_order
    assert [m["scores"]["dense"] for m in semantic["memories"]] == pytest.approx(sorted(sims, reverse=True), abs=1e-5)
    assert all(m["scores"]["bm25"] is None for m in semantic["memories"])

    fused = hash_engine.recall(query, dense_weight=0.5, top_k=50, score_cliff=0.0, fusion="rrf")
    for m in fused["memories"]:
        s = m["scores"]
        expected = sum(0.5 / (k + order.index(m["id"]) + 1) for order in (bm25_order, dense_order) if m["id"] in order)
        assert s["rrf"] == pytest.approx(expected)
    assert [m["rank"] for m in fused["memories"]] == list(range(1, len(fused["memories"]) + 1))
    assert fused["candidates"] >= len(fused["memories"])


def test_query_without_words_uses_dense(hash_engine):
    hash_engine.save(["smile 🙂 emoji", "plain text"])
    out = hash_engine.recall("🙂 ?! ***")
    assert out["memories"] and all(m["scores"]["bm25"] is None for m in out["memories"])
    assert hash_engine.recall("🙂", dense_weight=0.0)["memories"] == []


# -- real model ---------------------------------------------------------------------------------

RELEVANCE = [
    "The user's dog is named Biscuit and loves playing fetch.",
    "Quarterly tax filing deadline is April 15.",
    "Preferred programming language: Rust, for its memory safety.",
    "Allergic to peanuts; avoid nut-based dishes.",
    "Flight to Lisbon departs Friday at 9am from gate B12.",
    "Meeting notes: budget approved for new laptops.",
]


@pytest.mark.parametrize("query,expected", [
    ("canine puppy", 0), ("IRS paperwork", 1), ("coding", 2), ("airplane trip abroad", 4), ("computers purchase", 5),
])
def test_real_model_finds_paraphrases(engine, query, expected):
    ids = engine.save(RELEVANCE, session_id="user")["ids"]
    out = engine.recall(query, session_id="user", top_k=3)
    top = out["memories"][0]
    assert top["id"] == ids[expected], [m["content"] for m in out["memories"]]
    # No shared word: BM25 did not help, the dense side found it.
    assert top["scores"]["bm25"] is None and top["scores"]["dense"] > 0


def test_real_model_update_moves_meaning(engine):
    mid, other = engine.save(["My car is a red hatchback.", "Weekly groceries: bread, milk, eggs."], session_id="u")["ids"]

    def dense_score(query: str) -> float:
        return {m["id"]: m["scores"]["dense"] for m in engine.recall(query, session_id="u", dense_weight=1.0, min_dense=0.0, score_cliff=0.0)["memories"]}[mid]

    assert ids_of(engine.recall("automobile", session_id="u", dense_weight=1.0))[0] == mid
    before = dense_score("automobile")
    engine.update(mid, "I play the violin in a community orchestra.")
    assert ids_of(engine.recall("musical instrument hobby", session_id="u", dense_weight=1.0))[0] == mid
    assert dense_score("automobile") < before
    assert other in ids_of(engine.recall("breakfast shopping", session_id="u"))


def test_module_level_api(config):
    try:
        saved = save_memories(["module level memory about kites"], session_id="m", config=config)
        mid = saved["ids"][0]
        assert ids_of(recall_memories("kites", session_id="m", config=config)) == [mid]
        assert get_memory(mid, config=config)["content"] == "module level memory about kites"
        assert update_memory(mid, "module level memory about gliders", config=config)["version"] == 2
        assert delete_memory(mid, config=config)["deleted"] is True
    finally:
        close_engines()


def test_bm25_single_session_shortcut_matches_filtered_search(hash_engine):
    docs = [{"content": f"note {i} about apples and pears", "tags": ["fruit"] if i % 2 else []} for i in range(12)]
    ids = hash_engine.save(docs, session_id="only")["ids"]
    alone = hash_engine.candidate_search.bm25("apples pears", "only", [], 50)
    assert alone == hash_engine.candidate_search.bm25("apples pears", None, [], 50) and len(alone) == 12
    assert {i for i, _ in hash_engine.candidate_search.bm25("apples", "only", ["fruit"], 50)} == set(ids[1::2])
    # Once another session exists, the session filter applies again.
    hash_engine.save(["apples in another session"], session_id="other")
    assert {i for i, _ in hash_engine.candidate_search.bm25("apples", "only", [], 50)} == set(ids)

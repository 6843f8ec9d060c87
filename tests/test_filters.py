"""Recall filters: tags any/all, metadata equality, time ranges; applied inside candidate generation."""

from __future__ import annotations

import json
import random

import pytest
from conftest import HashEmbedder

from tinycontext import InvalidInputError, MemoryEngine
from tinycontext.retrieval.filters import parse_filters

WEIGHTS = (0.0, 0.5, 1.0)


def ids_of(result):
    return [m["id"] for m in result["memories"]]


@pytest.fixture(params=[200_000, 0], ids=["ram-index", "sqlite-vec"])
def fengine(request, config):
    """The engine with the in-RAM vector index, and with sqlite-vec's KNN (vector_cache_max=0)."""
    # score cliff off: a filter is checked by the set of memories it lets through, every one of them.
    with MemoryEngine(config.model_copy(update={"vector_cache_max": request.param, "recall_score_cliff": 0.0}), embedder=HashEmbedder()) as eng:
        yield eng


@pytest.fixture
def stocked(fengine):
    ids = fengine.save([
        {"content": "red apple pie recipe", "tags": ["food", "red"], "metadata": {"source": "chat", "n": 1, "ok": True, "who": {"name": "ann"}}},
        {"content": "red sports car apple", "tags": ["cars", "red"], "metadata": {"source": "web", "n": "1", "ok": False}},
        {"content": "green apple tart recipe", "tags": ["food"], "metadata": {"source": "chat", "n": 2.5, "ok": None}},
        {"content": "apple pie without tags"},
    ])["ids"]
    return fengine, ids


def test_tags_any_and_all(stocked):
    engine, ids = stocked
    for w in WEIGHTS:
        assert set(ids_of(engine.recall("apple", filters={"tags_any": ["cars", "nope"]}, dense_weight=w))) == {ids[1]}
        assert set(ids_of(engine.recall("apple", filters={"tags_all": ["food", "red"]}, dense_weight=w))) == {ids[0]}
        assert set(ids_of(engine.recall("apple", filters={"tags_all": ["food"]}, dense_weight=w))) == {ids[0], ids[2]}
        assert ids_of(engine.recall("apple", filters={"tags_all": ["food", "cars"]}, dense_weight=w)) == []
        # The tags shorthand and the filter both hold.
        assert set(ids_of(engine.recall("apple", tags=["red"], filters={"tags_all": ["food"]}, dense_weight=w))) == {ids[0]}


def test_metadata_equality_is_typed(stocked):
    engine, ids = stocked
    cases = [({"source": "chat"}, {ids[0], ids[2]}), ({"n": 1}, {ids[0]}), ({"n": "1"}, {ids[1]}), ({"n": 2.5}, {ids[2]}),
             ({"ok": True}, {ids[0]}), ({"ok": False}, {ids[1]}), ({"ok": None}, {ids[2]}), ({"who.name": "ann"}, {ids[0]}),
             ({"source": "chat", "n": 2.5}, {ids[2]}), ({"missing": "x"}, set())]
    for w in WEIGHTS:
        for meta, expected in cases:
            assert set(ids_of(engine.recall("apple", filters={"metadata": meta}, dense_weight=w))) == expected, (meta, w)


def test_time_ranges(stocked):
    engine, ids = stocked
    with engine.index.write() as conn:
        conn.execute("UPDATE memories SET created_at = '2024-01-10T00:00:00.000000+00:00' WHERE id = ?", (ids[0],))
        conn.execute("UPDATE memories SET created_at = '2024-06-01T12:00:00.000000+00:00', "
                     "updated_at = '2025-03-01T00:00:00.000000+00:00' WHERE id = ?", (ids[1],))
    for w in WEIGHTS:
        assert set(ids_of(engine.recall("apple", filters={"created_at": {"lt": "2024-02-01"}}, dense_weight=w))) == {ids[0]}
        assert set(ids_of(engine.recall("apple", filters={"created_at": {"gte": "2024-01-10", "lte": "2024-12-31"}}, dense_weight=w))) == {ids[0], ids[1]}
        # Offsets convert to UTC: 14:00+02:00 is 12:00Z, so "gt" excludes the 12:00Z memory.
        assert set(ids_of(engine.recall("apple", filters={"created_at": {"gt": "2024-06-01T14:00:00+02:00", "lt": "2025-01-01"}}, dense_weight=w))) == set()
        assert set(ids_of(engine.recall("apple", filters={"updated_at": {"gte": "2025-02-01", "lt": "2025-04-01"}}, dense_weight=w))) == {ids[1]}


def test_occurred_at_range(fengine):
    ids = fengine.save([{"content": "trip to paris", "occurred_at": "2023-05-08"},
                        {"content": "trip to rome", "occurred_at": "2023-05-20T13:56"},
                        {"content": "trip to oslo", "occurred_at": "2023-07-01"},
                        {"content": "trip undated"}])["ids"]
    for w in WEIGHTS:
        got = fengine.recall("trip", filters={"occurred_at": {"gte": "2023-05-08", "lt": "2023-06-01"}}, dense_weight=w)
        assert set(ids_of(got)) == {ids[0], ids[1]}
        assert set(ids_of(fengine.recall("trip", filters={"occurred_at": {"gt": "2023-06-01"}}, dense_weight=w))) == {ids[2]}
    with pytest.raises(InvalidInputError):
        fengine.recall("trip", filters={"occurred_at": {"gte": "last may"}})


@pytest.mark.parametrize("bad", [
    {"tags": ["a"]},  # unknown key
    {"created_at": {"after": "2024-01-01"}},  # unknown operator
    {"created_at": {"gt": 20240101}},  # wrong type
    {"created_at": {"gt": "yesterday"}},
    {"created_at": "2024-01-01"},
    {"tags_any": "food"},
    {"tags_all": [1]},
    {"tags_any": [f"t{i}" for i in range(65)]},  # huge list
    {"metadata": {"source') OR 1=1 --": "x"}},  # injection in a key
    {"metadata": {'a"]': 1}},
    {"metadata": {"$.x": 1}},
    {"metadata": {"x": [1, 2]}},
    {"metadata": {"x": float("nan")}},
    {"metadata": {f"k{i}": 1 for i in range(17)}},
    {"metadata": "source=chat"},
    ["tags_any"],
    "{not json",
])
def test_bad_filters_are_invalid_input_and_change_nothing(stocked, bad):
    engine, ids = stocked
    before = engine.store.read("SELECT id, content, tags, metadata, updated_at FROM memories ORDER BY id")
    with pytest.raises(InvalidInputError) as info:
        engine.recall("apple", filters=bad)
    assert info.value.code == "invalid_input"
    assert engine.store.read("SELECT id, content, tags, metadata, updated_at FROM memories ORDER BY id") == before


def test_parse_accepts_json_text_and_round_trips():
    parsed = parse_filters('{"tags_all": ["a", "a", "b"], "metadata": {"k": 1}, "created_at": {"gte": "2025-01-01"}}')
    assert parsed.to_dict() == {"tags_all": ["a", "b"], "metadata": {"k": 1},
                                "created_at": {"gte": "2025-01-01T00:00:00.000000+00:00"}}
    assert not parse_filters(None) and not parse_filters({})


def _bulk_store(engine: MemoryEngine, rows: list[tuple[str, list[str], str]]) -> list[int]:
    """Insert (content, tags, metadata JSON) rows straight into the tables the engine reads, with
    the test embedder's vectors: engine.save's per-memory dedup checks would dominate at 50k."""
    import json

    vectors = engine.embedder.embed_documents([r[0] for r in rows])
    with engine.index.write() as conn:
        conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES ('default', '2025-01-01')")
        conn.executemany(
            "INSERT INTO memories(id, session_id, content, tags, metadata, content_hash, tokens, created_at, updated_at) "
            "VALUES (?, 'default', ?, ?, ?, ?, 10, '2025-01-01T00:00:00.000000+00:00', NULL)",
            [(i + 1, c, json.dumps(t), m, str(i)) for i, (c, t, m) in enumerate(rows)])
        conn.executemany("INSERT INTO memory_tags(memory_id, tag) VALUES (?, ?)", [(i + 1, t) for i, r in enumerate(rows) for t in r[1]])
        conn.executemany("INSERT INTO memory_vectors(memory_id, session_id, embedding) VALUES (?, 'default', ?)",
                         [(i + 1, v.tobytes()) for i, v in enumerate(vectors)])
    return list(range(1, len(rows) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("cache", [200_000, 0], ids=["ram-index", "sqlite-vec"])
def test_selective_filter_on_50k_finds_matches_beyond_the_unfiltered_candidates(tmp_path, cache):
    """50k memories, 0.1% match: every matching memory ranks far below the unfiltered top 100, so
    a filter applied after the candidate cut would return nothing."""
    from tinycontext import TinyContextConfig

    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    rows = []
    for n in range(50_000):
        if n % 1000 == 7:  # rare: "coffee" once among many words
            rows.append(("coffee " + " ".join(rng.choices(words, k=12)) + f" rare{n}", ["rare"], '{"kind": "rare"}'))
        else:  # common: "coffee" twice in few words, so they outrank every rare one
            rows.append(("coffee coffee " + " ".join(rng.choices(words, k=3)), ["common"], '{"kind": "common"}'))
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", recall_candidates=100,
                               vector_cache_max=cache, recall_score_cliff=0.0)  # every match: the sets are under test
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        ids = _bulk_store(engine, rows)
        rare = {i for i, r in zip(ids, rows) if r[1] == ["rare"]}
        assert len(rare) == 50
        unfiltered = engine.recall("coffee", top_k=100, max_tokens=100_000)
        assert len(unfiltered["memories"]) == 100 and not set(ids_of(unfiltered)) & rare
        for w in WEIGHTS:
            for filters in ({"tags_all": ["rare"]}, {"metadata": {"kind": "rare"}}, {"tags_any": ["rare"], "metadata": {"kind": "rare"}}):
                # min_dense=0: a 14-word memory is a weak neighbour of "coffee"; the floor is not under test here.
                got = engine.recall("coffee", top_k=50, max_tokens=100_000, filters=filters, dense_weight=w, min_dense=0.0)
                assert set(ids_of(got)) == rare, (filters, w)


# -- adapters ---------------------------------------------------------------------------------


def test_cli_filter_flags(env, capsys):
    from tinycontext.cli.commands import main

    assert main(["save", "deploy notes for the api", "--tag", "ops", "--tag", "api", "--metadata", '{"source": "chat", "n": 2}']) == 0
    assert main(["save", "deploy notes for the web", "--tag", "ops", "--metadata", '{"source": "web"}']) == 0
    capsys.readouterr()

    def recall(*flags):
        assert main(["recall", "deploy notes", "--json", *flags]) == 0
        return [m["content"] for m in json.loads(capsys.readouterr().out)["memories"]]

    assert recall("--all-tag", "ops", "--all-tag", "api") == ["deploy notes for the api"]
    assert recall("--meta", "source=web") == ["deploy notes for the web"]
    assert recall("--meta", "n=2") == ["deploy notes for the api"]
    assert recall("--filter", '{"tags_any": ["api"]}') == ["deploy notes for the api"]
    assert recall("--until", "2000-01-01") == []
    assert len(recall("--since", "2000-01-01")) == 2
    assert main(["recall", "deploy", "--filter", '{"tags_any": ["api"], "colour": 1}']) == 1
    assert capsys.readouterr().err.startswith("invalid_input: filters: unknown key")
    assert main(["recall", "deploy", "--filter", "{oops"]) == 1
    assert capsys.readouterr().err.startswith("invalid_input: --filter is not valid JSON")


def test_rest_filters(hash_engine):
    import httpx

    from tinycontext.servers.fastapi_server import create_app
    from tinycontext.servers.http import ServeSettings, background

    ids = hash_engine.save([{"content": "alpha note", "tags": ["a", "b"], "metadata": {"k": "x"}}, {"content": "alpha memo", "tags": ["a"]}])["ids"]
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base, httpx.Client(base_url=base, timeout=30) as api:
        got = api.post("/recall_memories", json={"query": "alpha", "filters": {"tags_all": ["a", "b"]}})
        assert got.status_code == 200 and ids_of(got.json()) == [ids[0]]
        got = api.post("/recall_memories", json={"query": "alpha", "filters": {"metadata": {"k": "x"}, "created_at": {"gte": "2000-01-01"}}})
        assert ids_of(got.json()) == [ids[0]]
        for bad in ({"created_at": {"after": "2020"}}, {"metadata": {"a'b": 1}}, {"tags_any": [str(i) for i in range(100)]}, {"x": 1}):
            got = api.post("/recall_memories", json={"query": "alpha", "filters": bad})
            assert got.status_code in (400, 422) and got.json()["code"] == "invalid_input", bad


def test_mcp_filters(tmp_path):
    import anyio
    from mcp.shared.memory import create_connected_server_and_client_session

    from tinycontext import TinyContextConfig, close_engines
    from tinycontext.servers.mcp_server import build_server

    server = build_server(TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models"))

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "filters" in tools["recall_memories"].inputSchema["properties"]
            await client.call_tool("save_memories", {"memories": [
                {"content": "The cat sleeps on the sofa", "tags": ["pets", "home"], "metadata": {"room": "living"}},
                {"content": "The cat eats in the kitchen", "tags": ["pets"], "metadata": {"room": "kitchen"}}]})
            got = await client.call_tool("recall_memories", {"query": "cat", "filters": {"metadata": {"room": "kitchen"}}})
            assert [m["content"] for m in got.structuredContent["memories"]] == ["The cat eats in the kitchen"]
            got = await client.call_tool("recall_memories", {"query": "cat", "filters": {"tags_all": ["pets", "home"]}})
            assert [m["content"] for m in got.structuredContent["memories"]] == ["The cat sleeps on the sofa"]
            bad = await client.call_tool("recall_memories", {"query": "cat", "filters": {"created_at": {"since": "2020"}}})
            assert bad.isError and bad.content[0].text.startswith("invalid_input")
            bad = await client.call_tool("recall_memories", {"query": "cat", "filters": {"created_at": {"gt": "soon"}}})
            assert bad.isError and bad.content[0].text.startswith("invalid_input")

    try:
        anyio.run(scenario)
    finally:
        close_engines()

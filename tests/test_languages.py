"""Any language: FTS tokenizer choice (recorded, switched in place), trigram/CJK queries, the
multilingual model in the registry (downloaded from the fake hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.retrieval.conversation import episode_bm25
from tinycontext.retrieval.language import current_tokenizer, set_tokenizer, trigram_query

# (memory, query): each query must find its memory first by keywords alone (shared with scripts/bench_features.py).
_DATA = json.loads((Path(__file__).parent / "fixtures" / "multilingual.json").read_text(encoding="utf-8"))
CASES = {name: tuple(pair) for name, pair in _DATA["cases"].items()}
DISTRACTORS = _DATA["distractors"]


def found_first(engine, memory_ids: dict[str, int]) -> dict[str, bool]:
    return {name: (engine.recall(query, dense_weight=0.0)["memories"] or [{"id": None}])[0]["id"] == memory_ids[name]
            for name, (_, query) in CASES.items()}


def stock(engine) -> dict[str, int]:
    ids = engine.save([memory for memory, _ in CASES.values()] + DISTRACTORS)["ids"]
    return dict(zip(CASES, ids))


def config_for(tmp_path, tokenizer: str) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", fts_tokenizer=tokenizer)


def test_trigram_finds_every_language(tmp_path):
    with MemoryEngine(config_for(tmp_path, "trigram"), embedder=HashEmbedder()) as engine:
        ids = stock(engine)
        assert all(found_first(engine, ids).values()), found_first(engine, ids)
        # Hybrid recall keeps the keyword hit in the results.
        for name, (_, query) in CASES.items():
            assert ids[name] in [m["id"] for m in engine.recall(query)["memories"][:3]], name


def test_porter_misses_unsegmented_scripts_and_compounds(tmp_path):
    with MemoryEngine(config_for(tmp_path, "porter"), embedder=HashEmbedder()) as engine:
        found = found_first(engine, stock(engine))
    assert found["arabic"] and found["hindi"]
    assert not found["chinese"] and not found["german-compound"] and not found["emoji"]


def test_switching_tokenizer_rebuilds_in_place(tmp_path):
    with MemoryEngine(config_for(tmp_path, "porter"), embedder=HashEmbedder()) as engine:
        ids = stock(engine)
        assert current_tokenizer(engine.store) == "porter"
    with MemoryEngine(config_for(tmp_path, "trigram"), embedder=HashEmbedder()) as engine:
        assert current_tokenizer(engine.store) == "trigram"
        assert "tokenize='trigram'" in engine.store.read("SELECT sql FROM sqlite_master WHERE name = 'memories_fts'")[0][0]
        assert all(found_first(engine, ids).values())
        assert not set_tokenizer(engine.store, "trigram")  # re-running changes nothing
        # New saves, updates and deletes keep the rebuilt index in sync (triggers kept).
        new = engine.save(["新しい記憶です"])["ids"][0]
        assert engine.recall("記憶", dense_weight=0.0)["memories"][0]["id"] == new
        engine.update(ids["chinese"], "我喜欢喝咖啡")
        assert ids["chinese"] not in [m["id"] for m in engine.recall("喝茶", dense_weight=0.0)["memories"]]
        assert [r[0] for r in engine.store.read("SELECT id FROM memories ORDER BY id")] == sorted([*ids.values(), *range(9, 15), new])
    with MemoryEngine(config_for(tmp_path, "unicode61"), embedder=HashEmbedder()) as engine:
        assert current_tokenizer(engine.store) == "unicode61"
        assert engine.recall("القهوة", dense_weight=0.0)["memories"][0]["id"] == ids["arabic"]
        assert engine.store.read("PRAGMA integrity_check")[0][0] == "ok"


def test_episodes_follow_the_tokenizer(tmp_path):
    def definition(engine, table):
        return engine.store.read("SELECT sql FROM sqlite_master WHERE name = ?", (table,))[0][0]

    with MemoryEngine(config_for(tmp_path, "porter"), embedder=HashEmbedder()) as engine:
        first = engine.save([{"content": "我喜欢喝茶", "speaker": "Li"}, {"content": "我也是", "speaker": "Wang"}])["ids"]
        engine.save([{"content": "今天天气很好", "speaker": "Li"}])
        episode = engine.store.read("SELECT episode_id FROM memories WHERE id = ?", (first[0],))[0][0]
        texts = engine.store.read("SELECT rowid, text FROM episodes_fts ORDER BY rowid")
        assert episode_bm25(engine.store, "喝茶", None, "porter") == []  # porter: a run of Chinese is one token
        # What switching did before episodes followed the setting: turns on trigram, episodes left on porter.
        turns_trigram = definition(engine, "memories_fts").replace("porter unicode61 remove_diacritics 2", "trigram")
        with engine.store.write() as conn:
            conn.execute("DROP TABLE memories_fts")
            conn.execute(turns_trigram)
            conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_tokenizer', 'trigram')")
    with MemoryEngine(config_for(tmp_path, "trigram"), embedder=HashEmbedder()) as engine:
        assert "tokenize='trigram'" in definition(engine, "episodes_fts")  # repaired on open
        assert engine.store.read("SELECT rowid, text FROM episodes_fts ORDER BY rowid") == texts
        assert [e for e, _ in episode_bm25(engine.store, "喜欢喝茶吗", None, "trigram")] == [episode]
        assert not set_tokenizer(engine.store, "trigram")  # re-running changes nothing
        later = engine.save([{"content": "我想喝咖啡", "speaker": "Wang"}])["ids"][0]  # new episodes use the rebuilt index
        assert engine.store.read("SELECT episode_id FROM memories WHERE id = ?", (later,))[0][0] in [
            e for e, _ in episode_bm25(engine.store, "想喝咖啡", None, "trigram")]
        assert engine.recall("喝茶", dense_weight=0.0)["memories"][0]["id"] == first[0]
    with MemoryEngine(config_for(tmp_path, "unicode61"), embedder=HashEmbedder()) as engine:
        assert "remove_diacritics 2'" in definition(engine, "episodes_fts") and "porter" not in definition(engine, "episodes_fts")
        assert engine.store.read("PRAGMA integrity_check")[0][0] == "ok"


def test_trigram_query_is_never_fts_syntax():
    match, short = trigram_query('我喜欢喝茶吗 "NEAR(a b)" OR x* 🎉 ab')
    assert short == ["a", "b", "or", "x", "🎉", "ab"]
    assert match.startswith('"我喜欢" OR "喜欢喝"')
    assert all(piece.startswith('"') and piece.endswith('"') for piece in match.split(" OR "))  # only quoted strings
    assert trigram_query("  ,, ") == (None, [])


def test_cli_with_trigram(env, capsys, monkeypatch):
    from tinycontext.cli.commands import main

    monkeypatch.setenv("TINYCONTEXT_FTS_TOKENIZER", "trigram")
    assert main(["save", "我喜欢喝茶", "I like coffee"]) == 0
    capsys.readouterr()
    assert main(["recall", "喝茶", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memories"][0]["content"] == "我喜欢喝茶"


@pytest.fixture
def hub_online(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def test_multilingual_model_downloads_pinned_with_its_prefixes(shared_dir, tmp_path, hub_online):
    """The registry's multilingual entry resolves to its pinned commit with e5's prefixes. The fake hub
    serves MiniLM files under that repo: this checks download and wiring, not multilingual quality."""
    from fake_hub import FakeHub

    from tinycontext.models.embedder import Embedder
    from tinycontext.models.hub import REGISTRY, resolve_model

    entry = REGISTRY["multilingual-e5-small"]
    model = shared_dir / "models" / "minilm-l6-int8"
    files = {"onnx/model.onnx": model / "model.onnx", "tokenizer.json": model / "tokenizer.json"}
    with FakeHub({entry.repo_id: {entry.revision: files}}) as hub:
        bundle = resolve_model("multilingual", tmp_path, endpoint=hub.url)
    assert (bundle.name, bundle.revision, bundle.query_prefix, bundle.document_prefix) == (
        "multilingual-e5-small", entry.revision, "query: ", "passage: ")
    identity = Embedder(bundle).identity
    assert identity["query_prefix"] == "query: " and identity["dimensions"] == 384

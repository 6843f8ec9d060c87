"""Keyword-only mode: BM25 without a model, said everywhere; vectors back-filled when a model appears."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import HashEmbedder

from tinycontext import MemoryEngine, ModelUnavailableError, TinyContextConfig


@pytest.fixture
def kconfig(tmp_path) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend="none")


def test_no_model_runs_on_bm25(kconfig):
    with MemoryEngine(kconfig) as engine:
        assert engine.embedder is None and engine.search_mode == "keyword"
        out = engine.save(["The user drinks green tea", "Deploys happen on Friday", "The user drinks green tea"])
        assert len(out["ids"]) == 2 and out["skipped"][0]["reason"] == "duplicate"
        got = engine.recall("green tea")
        assert got["mode"] == "keyword" and [m["content"] for m in got["memories"]] == ["The user drinks green tea"]
        assert got["memories"][0]["scores"]["dense"] is None
        page = engine.recall_rendered("deploys friday")
        assert page.structured["mode"] == "keyword" and "Deploys happen on Friday" in page.text
        assert engine.stats()["vectors"] == 0 and engine.stats()["memories"] == 2
        engine.update(out["ids"][0], "The user drinks black coffee")
        assert engine.recall("coffee")["memories"][0]["id"] == out["ids"][0]
        assert engine.delete(out["ids"][1])["deleted"]


def test_fallback_only_when_allowed(tmp_path):
    broken = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models",
                               embedding_model=str(tmp_path / "no-such-model"))
    with pytest.raises(ModelUnavailableError), MemoryEngine(broken) as engine:
        engine.save(["the model loads on first use"])
    with MemoryEngine(broken.model_copy(update={"keyword_fallback": True})) as engine:
        engine.save(["saved while the model was missing"])
        assert engine.search_mode == "keyword" and "unavailable" in engine.keyword_reason
        assert engine.recall("model missing")["memories"]


def test_vectors_are_back_filled_when_a_model_appears(kconfig):
    hashed = kconfig.model_copy(update={"embedding_backend": "onnx"})
    # A database that never had a model: binding one embeds everything.
    with MemoryEngine(kconfig) as engine:
        engine.save(["alpha memory about tea", "beta memory about code"])
    with MemoryEngine(hashed, embedder=HashEmbedder()) as engine:
        assert engine.reindexed == 2 and engine.stats()["vectors"] == 2
        engine.save(["gamma memory with a vector"])
    # Saved keyword-only into a database that has vectors: missing until reindex.
    with MemoryEngine(kconfig) as engine:
        kept = engine.save(["delta memory saved without a model"])["ids"][0]
    with MemoryEngine(hashed, embedder=HashEmbedder()) as engine:
        assert engine.reindexed == 0 and engine.stats()["vectors"] == 3
        assert kept not in [m["id"] for m in engine.recall("delta memory saved without a model", dense_weight=1.0)["memories"]]
    with MemoryEngine(hashed.model_copy(update={"reindex": "auto"}), embedder=HashEmbedder()) as engine:
        assert engine.reindexed == 1 and engine.stats()["vectors"] == 4
        assert engine.recall("delta memory saved without a model", dense_weight=1.0)["memories"][0]["id"] == kept
        stored = engine.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = ?", (kept,))[0][0]
        assert np.allclose(np.frombuffer(stored, np.float32), HashEmbedder().embed_documents(["delta memory saved without a model"])[0])


def test_doctor_cli_and_mcp_say_keyword_only(env, capsys, monkeypatch):
    from tinycontext.cli.commands import main
    from tinycontext.cli.doctor import run_checks

    monkeypatch.setenv("TINYCONTEXT_EMBEDDING_BACKEND", "none")
    assert main(["save", "Standups are at 9:30"]) == 0
    capsys.readouterr()
    report = run_checks()
    assert report["ok"], report
    model = next(c for c in report["checks"] if c["name"] == "model")
    assert "keyword-only" in model["summary"]
    assert main(["recall", "standups", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "keyword"
    assert main(["reindex"]) == 1
    assert capsys.readouterr().err.startswith("model_unavailable")

    import anyio
    from mcp.shared.memory import create_connected_server_and_client_session

    from tinycontext import close_engines, load_config
    from tinycontext.servers.mcp_server import build_server

    server = build_server(load_config())

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            got = await client.call_tool("recall_memories", {"query": "standups"})
            assert got.structuredContent["mode"] == "keyword" and "9:30" in got.content[0].text

    try:
        anyio.run(scenario)
    finally:
        close_engines()
    assert "keyword-only" in server.instructions


def test_doctor_flags_memories_without_vectors(tmp_path, monkeypatch):
    from tinycontext.cli.doctor import run_checks

    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models")
    with MemoryEngine(config.model_copy(update={"embedding_backend": "none"})) as engine:
        engine.save(["no vector here"])
    (tmp_path / "c.json").write_text(json.dumps({"memory_db_path": str(tmp_path / "m.db"), "models_dir": str(tmp_path / "models")}))
    for key in ("TINYCONTEXT_EMBEDDING_BACKEND", "TINYCONTEXT_MEMORY_DB_PATH"):
        monkeypatch.delenv(key, raising=False)
    report = run_checks(tmp_path / "c.json")
    database = next(c for c in report["checks"] if c["name"] == "database")
    assert "1 memory has no vector yet" in database["summary"]

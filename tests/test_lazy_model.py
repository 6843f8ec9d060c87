"""get / delete / sessions / stats never load the embedding model, so they work when it cannot load
and on a database built by another model; save and recall load it and raise the typed error."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from conftest import HashEmbedder
from mcp.shared.memory import create_connected_server_and_client_session

from tinycontext import MemoryEngine, ModelMismatchError, ModelUnavailableError, TinyContextConfig, close_engines
from tinycontext.models import backends as embedders
from tinycontext.cli.commands import main
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background
from tinycontext.servers.mcp_server import build_server

TURN = {"content": "I adopted a puppy", "speaker": "Caroline", "occurred_at": "2023-05-08T13:56", "attachments": ["a photo of a dog"]}


@pytest.fixture
def built(tmp_path, env) -> tuple[TinyContextConfig, list[int]]:
    """A database built by another embedder (another identity than whatever this config loads)."""
    config = TinyContextConfig(memory_db_path=env["TINYCONTEXT_MEMORY_DB_PATH"], models_dir=env["TINYCONTEXT_MODELS_DIR"])
    with MemoryEngine(config, embedder=HashEmbedder(model="built-by-another-model")) as engine:
        ids = engine.save([TURN, {"content": "Deploys happen on Fridays"}], session_id="s")["ids"]
    yield config, ids
    close_engines()


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """Counts model loads; each returns an embedder whose identity differs from the database's."""
    calls: list[str] = []

    def create_embedder(config):
        calls.append(config.embedding_model)
        return HashEmbedder()

    monkeypatch.setattr(embedders, "create_embedder", create_embedder)
    return calls


@pytest.fixture
def unloadable(monkeypatch) -> None:
    def create_embedder(config):
        raise ModelUnavailableError("the test made the model unloadable")

    monkeypatch.setattr(embedders, "create_embedder", create_embedder)


def test_library_reads_and_deletes_without_the_model(built, loads):
    config, (turn, other) = built
    with MemoryEngine(config) as engine:
        got = engine.get(turn)
        assert got["speaker"] == "Caroline" and got["attachments"] == ["a photo of a dog"]
        assert [s["session_id"] for s in engine.sessions()] == ["s"]
        assert engine.list_sessions()["sessions"][0]["memories"] == 2
        stats = engine.stats()
        assert stats["memories"] == 2 and stats["vectors"] == 2 and stats["embedder"]["model"] == "built-by-another-model"
        assert engine.list_memories(session_id="s").structured["memories"]
        assert engine.delete(other)["deleted"] and engine.stats()["vectors"] == 1
        assert loads == []
        with pytest.raises(ModelMismatchError):
            engine.save(["a new memory"])
        with pytest.raises(ModelMismatchError):
            engine.recall("puppy")
        assert len(loads) == 1  # loaded once; binding is retried (and refused) on each call that needs it
        assert engine.get(turn)["content"] == TURN["content"]


def test_library_without_a_loadable_model(built, unloadable):
    config, (turn, other) = built
    with MemoryEngine(config) as engine:
        assert engine.get(turn)["id"] == turn and engine.stats()["memories"] == 2 and engine.sessions()
        assert engine.delete(other)["deleted"]
        with pytest.raises(ModelUnavailableError):
            engine.recall("puppy")


def test_cli(built, loads, capsys):
    _, (turn, other) = built
    for argv in (["get", str(turn), "--json"], ["sessions", "--json"], ["stats", "--json"], ["delete", str(other)]):
        assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "Caroline" in out and "built-by-another-model" in out
    assert loads == []
    assert main(["recall", "puppy"]) == 1 and capsys.readouterr().err.startswith("model_mismatch: ")


def test_mcp_tools(built, unloadable):
    config, (turn, other) = built
    server = build_server(config.model_copy(update={"tools": ("memory", "manage")}))

    async def scenario():
        async with create_connected_server_and_client_session(server._mcp_server) as client:
            async def call(name, arguments):
                result = await client.call_tool(name, arguments)
                assert not result.isError, result.content[0].text
                return result.structuredContent

            assert (await call("get_memory", {"id": turn}))["speaker"] == "Caroline"
            assert (await call("list_sessions", {}))["sessions"][0]["session_id"] == "s"
            stats = json.loads((await client.read_resource("tinycontext://stats")).contents[0].text)
            assert stats["memories"] == 2
            assert (await call("delete_memory", {"id": other}))["deleted"]
            failed = await client.call_tool("save_memories", {"memories": [{"content": "new"}]})
            assert failed.isError and failed.content[0].text.startswith("model_unavailable")

    anyio.run(scenario)


def test_rest(built, unloadable):
    config, (turn, other) = built
    with background(create_app(config, settings=ServeSettings())) as base, httpx.Client(base_url=base, timeout=30) as api:
        assert api.post("/get_memory", json={"id": turn}).json()["speaker"] == "Caroline"
        assert api.get("/sessions").json()["sessions"][0]["memories"] == 2
        assert api.post("/delete_memory", json={"id": other}).json() == {"id": other, "deleted": True}
        failed = api.post("/save_memories", json={"memories": [{"content": "new"}]})
        assert (failed.status_code, failed.json()["code"]) == (503, "model_unavailable")

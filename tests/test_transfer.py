"""Export/import round trips, legacy TinyContext import, and online backup, on real SQLite files."""

from __future__ import annotations

import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid

import numpy as np
import pytest
from conftest import HashEmbedder
from consistency import assert_consistent

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.errors import InvalidInputError
from tinycontext.memory.transfer import CHUNK, backup, export_jsonl, import_file, import_jsonl

LEGACY_SCHEMA = """
CREATE TABLE memories (
  id TEXT PRIMARY KEY, session_id TEXT, content TEXT NOT NULL, created_at TEXT NOT NULL,
  embedding BLOB, embedding_model TEXT, embedding_dimensions INTEGER,
  superseded_by TEXT, superseded_at TEXT, last_recalled_at TEXT, recall_count INTEGER NOT NULL DEFAULT 0,
  kind TEXT NOT NULL DEFAULT 'episodic');
CREATE VIRTUAL TABLE memories_fts USING fts5(id UNINDEXED, session_id UNINDEXED, content);
"""


def _engine(tmp_path, name, embedder=None):
    config = TinyContextConfig(memory_db_path=tmp_path / f"{name}.db", models_dir=tmp_path / "models")
    return MemoryEngine(config, embedder=embedder or HashEmbedder())


def _dump(engine, **kwargs) -> str:
    out = io.StringIO()
    export_jsonl(engine, out, **kwargs)
    return out.getvalue()


@pytest.fixture
def source(tmp_path):
    with _engine(tmp_path, "source") as engine:
        engine.save([{"content": "Alice prefers tabs over spaces", "tags": ["style"], "metadata": {"who": "alice", "n": [1, 2]}},
                      {"content": "The release train leaves on Thursdays"}], session_id="team")
        engine.save(["Bob is allergic to peanuts"], session_id="bob")
        engine.update(1, "Alice prefers tabs, width 4", tags=["style", "editor"])
        engine.delete(2)
        with engine.store.write() as conn:  # a session with no memories must survive too
            conn.execute("INSERT INTO sessions(id, created_at) VALUES ('empty', '2024-01-01T00:00:00+00:00')")
        yield engine


def test_round_trip_keeps_everything_and_reuses_vectors(tmp_path, source):
    text = _dump(source)
    with _engine(tmp_path, "target") as target:
        report = import_jsonl(target, io.StringIO(text))
        assert (report.imported, report.embedded, report.history, report.renumbered) == (2, 0, 1, {})
        for memory_id in (1, 3):
            assert target.get(memory_id) == source.get(memory_id)
        assert {s["session_id"]: s["created_at"] for s in target.sessions()} == {s["session_id"]: s["created_at"] for s in source.sessions()}
        same = target.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = 1")[0][0]
        assert same == source.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = 1")[0][0]
        assert target.recall("tabs", session_id="team")["memories"][0]["id"] == 1
        assert target.recall("tabs", tags=["editor"])["memories"][0]["id"] == 1
        assert_consistent(target)
        again = import_jsonl(target, io.StringIO(text))
        assert (again.imported, again.skipped) == (0, 2)
        assert _dump(target).splitlines()[1:] == text.splitlines()[1:]


def test_other_embedder_re_embeds_and_taken_ids_are_renumbered(tmp_path, source):
    text = _dump(source, session_id="team")
    assert [json.loads(line)["type"] for line in text.splitlines()] == ["header", "session", "memory"]
    other = HashEmbedder(dimensions=32, model="hash-other")
    with _engine(tmp_path, "other", other) as target:
        target.save(["Something already at id one"], session_id="mine")
        report = import_jsonl(target, io.StringIO(text))
        assert (report.imported, report.embedded, report.renumbered) == (1, 1, {1: 2})
        vector = np.frombuffer(target.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = 2")[0][0], np.float32)
        assert np.allclose(vector, other.embed_documents(["Alice prefers tabs, width 4"])[0])
        assert target.get(2)["history"][0]["content"] == "Alice prefers tabs over spaces"
        assert_consistent(target)


@pytest.mark.parametrize("lines, match", [
    (['{"type": "memory"}'], "header"),
    (["not json"], "not JSON"),
    (['{"type": "header", "format": "other", "format_version": 1}'], "unsupported"),
    (['{"type": "header", "format": "tinycontext-export", "format_version": 1}', '{"type": "memory", "id": "x"}'], ":2"),
    (['{"type": "header", "format": "tinycontext-export", "format_version": 1}',
      '{"type": "memory", "id": 5, "session_id": "s", "created_at": "2024-01-01", "content": "a\\u0000b"}'], "NUL"),
])
def test_bad_export_lines_name_the_line(tmp_path, lines, match):
    with _engine(tmp_path, "bad") as target:
        with pytest.raises(InvalidInputError, match=match):
            import_jsonl(target, io.StringIO("\n".join(lines)), source="f.jsonl")
        assert target.stats()["memories"] == 0


def _legacy_db(path, vector_model: str, dims: int, rows: list[tuple]) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    for rid, session, content, created, vector, superseded_by in rows:
        blob = np.asarray(vector, np.float32).tobytes() if vector is not None else None
        conn.execute("INSERT INTO memories(id, session_id, content, created_at, embedding, embedding_model, embedding_dimensions, "
                     "superseded_by, superseded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (rid, session, content, created, blob, vector_model if blob else None, dims if blob else None,
                      superseded_by, "2025-03-02T00:00:00Z" if superseded_by else None))
        conn.execute("INSERT INTO memories_fts(id, session_id, content) VALUES (?, ?, ?)", (rid, session, content))
    conn.commit()
    conn.close()


def test_legacy_tinysuite_database_imports(tmp_path, real_embedder):
    ids = [str(uuid.uuid4()) for _ in range(4)]
    legacy = tmp_path / "legacy.db"
    _legacy_db(legacy, "onnx:onnx-models/all-MiniLM-L6-v2-onnx:document-prefix:e3b0c44298fc", 384, [
        (ids[0], "work", "We deploy with Kubernetes on GKE", "2025-01-05T10:00:00Z", np.ones(384), None),
        (ids[1], None, "Old fact: lunch is at noon", "2025-02-01T09:00:00Z", None, ids[2]),
        (ids[2], None, "Lunch moved to 12:30", "2025-03-02T00:00:00Z", None, None),
        (ids[3], "work", "We deploy with Kubernetes on GKE", "2025-01-06T10:00:00Z", np.ones(384), None),  # same text
    ])
    with _engine(tmp_path, "new", real_embedder) as target:
        report = import_file(target, legacy)
        assert (report.imported, report.skipped, report.history, report.embedded) == (2, 1, 1, 2)
        memories = {m["metadata"]["legacy_id"]: m for m in (target.get(i) for i in (1, 2))}
        deploy, lunch = memories[ids[0]], memories[ids[2]]
        assert (deploy["session_id"], deploy["created_at"]) == ("work", "2025-01-05T10:00:00Z")
        assert lunch["session_id"] == "default" and lunch["version"] == 2
        assert lunch["history"][0]["content"] == "Old fact: lunch is at noon"
        # The legacy vector came from another model, so it was replaced by a real embedding.
        stored = np.frombuffer(target.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = ?", (deploy["id"],))[0][0], np.float32)
        assert np.allclose(stored, real_embedder.embed_documents([deploy["content"]])[0], atol=1e-5)
        # By meaning alone (no word in common), above the relevance floor (0.3) with either package model: "where is our
        # cluster hosted?" scores 0.345 on minilm-l6-int8 but 0.293 on minilm-l6-tuned (notes/locomo.md, session 18).
        assert target.recall("which cloud runs our containers?", dense_weight=1.0)["memories"][0]["id"] == deploy["id"]
        assert_consistent(target)
        assert import_file(target, legacy).imported == 0


def test_legacy_vectors_reused_when_model_matches(tmp_path):
    identity_model = HashEmbedder(dimensions=8, model="bge-small-en-v1.5")  # a registry name: BAAI/bge-small-en-v1.5
    legacy = tmp_path / "legacy.db"
    vector = np.arange(1, 9, dtype=np.float32)
    _legacy_db(legacy, "onnx:BAAI/bge-small-en-v1.5:document-prefix:e3b0c44298fc", 8,
               [("a", "s", "kept vector", "2025-01-01T00:00:00Z", vector, None)])
    with _engine(tmp_path, "new", identity_model) as target:
        assert import_file(target, legacy).embedded == 0
        stored = np.frombuffer(target.store.read("SELECT embedding FROM memory_vectors")[0][0], np.float32)
        assert np.allclose(stored, vector / np.linalg.norm(vector))


def test_not_a_legacy_database(tmp_path, source):
    with _engine(tmp_path, "x") as target, pytest.raises(InvalidInputError, match="export"):
        import_file(target, source.store.path)


def test_backup_is_a_consistent_standalone_copy(tmp_path, source):
    result = backup(source, tmp_path / "copies" / "b.db")
    assert result["memories"] == 2
    with pytest.raises(InvalidInputError, match="exists"):
        backup(source, tmp_path / "copies" / "b.db")
    config = TinyContextConfig(memory_db_path=tmp_path / "copies" / "b.db", models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as copy:
        assert copy.get(1) == source.get(1)
        assert_consistent(copy)


def test_cli_export_import_backup(tmp_path, source):
    env_source = {"TINYCONTEXT_MEMORY_DB_PATH": str(source.store.path)}
    def run(*args, env, **kwargs):
        return subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", *args], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=120, **kwargs)

    exported = run("export", "--no-vectors", env=env_source)
    assert exported.returncode == 0, exported.stderr
    assert '"vector":' not in exported.stdout and exported.stdout.count('"type": "memory"') == 2
    target = {"TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "cli.db"), "TINYCONTEXT_MODELS_DIR": str(tmp_path / "models")}
    imported = run("import", "-", "--json", env=target, input=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["imported"] == 2 and json.loads(imported.stdout)["embedded"] == 2
    backed = run("backup", str(tmp_path / "cli-backup.db"), env=target)
    assert backed.returncode == 0 and (tmp_path / "cli-backup.db").is_file()
    missing = run("export", env={"TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "none.db")})
    assert missing.returncode == 1 and missing.stderr.startswith("storage_error")


# -- issue 19: keyword-only import, out-of-range and malformed records, all or nothing -------------

HEADER = {"type": "header", "format": "tinycontext-export", "format_version": 1}


def _good(i: int) -> dict:
    return {"type": "memory", "id": i, "session_id": "s", "created_at": "2024-05-01T10:00:00+00:00", "content": f"good memory number {i}"}


def test_keyword_only_import_from_the_cli(tmp_path, source):
    """TINYCONTEXT_EMBEDDING_BACKEND=none: the import stores text and history, vectors are left for reindex."""
    export = tmp_path / "e.jsonl"
    export.write_text(_dump(source), encoding="utf-8")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}, "TINYCONTEXT_EMBEDDING_BACKEND": "none",
           "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "kw.db"), "TINYCONTEXT_MODELS_DIR": str(tmp_path / "models")}
    for _ in range(2):  # a second run finds everything present
        done = subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", "import", str(export), "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["skipped"] == 2
    config = TinyContextConfig(memory_db_path=tmp_path / "kw.db", models_dir=tmp_path / "models", embedding_backend="none")
    with MemoryEngine(config) as target:
        assert target.get(1)["content"] == source.get(1)["content"] and target.get(1)["history"] == source.get(1)["history"]
        assert target.recall("who is allergic to peanuts")["memories"][0]["id"] == 3
        assert target.store.read("SELECT count(*) FROM memory_vectors")[0][0] == 0


@pytest.mark.parametrize("bad, match", [
    ({"id": 2**63}, "id must be an integer from 1 to 9223372036854775807"),
    ({"id": 10**30}, "id must be an integer"),
    ({"id": 0}, "id must be an integer"),
    ({"id": True}, "id must be an integer"),
    ({"version": 2**63}, "version must be an integer"),
    ({"version": 1.5}, "version must be an integer"),
    ({"history": [{"version": 2**64, "content": "old", "created_at": "2024-01-01", "superseded_at": "2024-01-02"}]}, "history version"),
    ({"created_at": "yesterday-ish"}, "created_at: 'yesterday-ish' is not an ISO 8601"),
    ({"created_at": None}, "created_at must be an ISO 8601"),
    ({"updated_at": "soon"}, "updated_at"),
    ({"expires_at": "never"}, "expires_at"),
    ({"occurred_at": "last summer"}, "occurred_at"),
    ({"history": [{"version": 1, "content": "old", "created_at": "a while ago", "superseded_at": "2024-01-02"}]}, "history created_at"),
    ({"colour": "blue"}, "unknown field 'colour' in a memory record"),
    ({"history": [{"version": 1, "content": "old", "created_at": "2024-01-01", "superseded_at": "2024-01-02", "by": "x"}]},
     "unknown field 'by' in a history record"),
    ({"session_id": 7}, "session_id must be a string"),
    ({"content": "\u3000\u200b"}, "empty content"),
    ({"metadata": {"n": float("inf")}}, "plain JSON"),
    ({"uid": "a\u0000b"}, "uid contains a NUL character"),
])
def test_a_bad_record_anywhere_imports_nothing(tmp_path, bad, match):
    """The bad record is the file's last line, after more than one write batch of good ones: the
    error names that line and nothing from the file is stored (no memory, no session)."""
    lines = [HEADER, {"type": "session", "id": "s", "created_at": "2024-05-01T10:00:00+00:00"},
             *(_good(i) for i in range(1, CHUNK + 10)), {**_good(10_000), **bad}]
    text = "\n".join(json.dumps(r) for r in lines)
    path = tmp_path / "bad.jsonl"
    path.write_text(text, encoding="utf-8")
    with _engine(tmp_path, "target") as target:
        for attempt in (lambda: import_file(target, path), lambda: import_jsonl(target, io.StringIO(text), source="stdin")):
            with pytest.raises(InvalidInputError, match=re.escape(match)) as err:
                attempt()
            assert err.value.code == "invalid_input" and f":{len(lines)}: " in err.value.message
            assert target.stats()["memories"] == 0 and target.sessions() == []


@pytest.mark.parametrize("bad, match", [
    ({"valid_until": "2024\u0000"}, "valid_until contains a NUL"),
    ({"created_at": "2024\u0000"}, "created_at contains a NUL"),
    ({"superseded_by": 2**64}, "superseded_by must be an integer from 1"),
    ({"id": 2**63}, "id must be an integer from 1"),
])
def test_the_engine_refuses_what_sqlite_would_not_store_as_given(tmp_path, bad, match):
    """import_memories (the library's bulk path) checks what an export carries as the file importer does: text
    SQLite keeps as given, integers it holds. Nothing is stored."""
    with _engine(tmp_path, "target") as target:
        with pytest.raises(InvalidInputError, match=re.escape(match)):
            target.import_memories([{"content": "fine"}, {"content": "also fine", **bad}], session_id="s")
        assert target.stats()["memories"] == 0


@pytest.mark.parametrize("record, match", [
    ({**HEADER, "compression": "zstd"}, "unknown field 'compression' in a header record"),
    ({"type": "session", "id": "s", "created_at": "2024-01-01", "owner": "x"}, "unknown field 'owner' in a session record"),
    ({"type": "session", "id": "s", "created_at": "at some point"}, "session created_at"),
])
def test_bad_header_and_session_records(tmp_path, record, match):
    lines = [HEADER, _good(1), record] if record.get("type") == "session" else [record, _good(1)]
    with _engine(tmp_path, "target") as target:
        with pytest.raises(InvalidInputError, match=re.escape(match)):
            import_jsonl(target, io.StringIO("\n".join(json.dumps(r) for r in lines)), source="f.jsonl")
        assert target.stats()["memories"] == 0


def test_an_import_is_one_transaction(tmp_path, source, monkeypatch):
    """A failure while writing (here: the third write batch) rolls back the batches written before it."""
    import tinycontext.memory.imports.base as transfer  # where every import writes its batches

    lines = [HEADER, *(_good(i) for i in range(1, 3 * CHUNK))]
    calls = []
    real = transfer._import_chunk

    def failing(engine, chunk, report):
        calls.append(len(chunk))
        if len(calls) == 3:
            raise InvalidInputError("f.jsonl:9: stand-in failure of the third batch")
        real(engine, chunk, report)

    monkeypatch.setattr(transfer, "_import_chunk", failing)
    with _engine(tmp_path, "target") as target:
        with pytest.raises(InvalidInputError, match="third batch"):
            import_jsonl(target, io.StringIO("\n".join(json.dumps(r) for r in lines)))
        assert calls == [CHUNK, CHUNK, CHUNK - 1]
        assert target.stats()["memories"] == 0 and target.sessions() == []
        monkeypatch.setattr(transfer, "_import_chunk", real)
        assert import_jsonl(target, io.StringIO("\n".join(json.dumps(r) for r in lines))).imported == 3 * CHUNK - 1
        assert_consistent(target)

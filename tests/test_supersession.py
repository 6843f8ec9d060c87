"""Facts that supersede facts: save with supersedes (the old memory keeps its text and history and gets
valid_until), recall preferring current facts and saying when it shows an outdated one, supersession
candidates reported on save (never applied), schema v8 and export/import; library, CLI, MCP, REST."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys

import anyio
import httpx
import pytest
from conftest import HashEmbedder
from consistency import assert_consistent
from test_mcp_stdio import run_session, server_env

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.errors import ConflictError, InvalidInputError, MemoryNotFoundError
from tinycontext.memory import store
from tinycontext.memory.schema import MIGRATIONS, SCHEMA_VERSION
from tinycontext.memory.transfer import export_jsonl, import_jsonl
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background

OLD, NEW = "The staging cluster runs Kubernetes 1.29", "The staging cluster runs Kubernetes 1.30"


def _engine(tmp_path, name="memory", **settings):
    config = TinyContextConfig(memory_db_path=tmp_path / f"{name}.db", models_dir=tmp_path / "models", **settings)
    return MemoryEngine(config, embedder=HashEmbedder())


def test_supersedes_ends_the_old_fact_and_recall_prefers_the_new(tmp_path):
    with _engine(tmp_path) as engine:
        old = engine.save([OLD, "Ada prefers tabs"])["ids"][0]
        engine.update(old, OLD + " in eu-west")  # history to keep
        saved = engine.save([{"content": NEW, "supersedes": old, "valid_from": "2025-03-01T00:00:00Z"}])
        new = saved["ids"][0]
        assert saved["saved"][0]["supersedes"] == old
        before, after = engine.get(old), engine.get(new)
        assert (before["superseded_by"], before["valid_until"]) == (new, "2025-03-01T00:00:00.000000+00:00")
        assert after["valid_from"] == before["valid_until"] and "valid_until" not in after
        assert before["content"] == OLD + " in eu-west" and before["version"] == 2 and before["history"][0]["content"] == OLD
        answer = engine.recall("which Kubernetes version does staging run")
        assert [m["id"] for m in answer["memories"]][:1] == [new] and old not in [m["id"] for m in answer["memories"]]
        assert answer["superseded"] == 1  # it says an outdated fact was left out
        shown = engine.recall("which Kubernetes version does staging run", include_superseded=True)
        marked = [m for m in shown["memories"] if m["id"] == old]
        assert marked and marked[0]["superseded_by"] == new and "superseded" not in shown
        page = engine.recall_rendered("which Kubernetes version does staging run", include_superseded=True)
        assert f"superseded by {new}" in page.text and page.structured["memories"][[m["id"] for m in page.structured["memories"]].index(old)][
            "superseded_by"] == new
        assert "superseded by" not in engine.recall_rendered("which Kubernetes version does staging run").text
        with pytest.raises(ConflictError, match=f"already superseded by {new}"):
            engine.save([{"content": "The staging cluster runs Kubernetes 1.31", "supersedes": old}])
        with pytest.raises(MemoryNotFoundError):
            engine.save([{"content": "The staging cluster runs Kubernetes 1.31", "supersedes": 999}])
        with pytest.raises(InvalidInputError, match="same memory"):
            engine.save([{"content": "a fact", "supersedes": new}, {"content": "another", "supersedes": new}])
        assert engine.stats()["memories"] == 3  # the refused calls saved nothing
        assert_consistent(engine)


def test_superseded_among_walks_the_index_while_it_is_small(tmp_path):
    """Which candidates are superseded: the same answer whether the partial index is walked (few superseded rows)
    or every id is looked up (many)."""
    with _engine(tmp_path, dedup_mode="off") as engine:
        ids = engine.save([f"fact number {i}" for i in range(400)])["ids"]
        asked = ids[::40]
        statements: list[str] = []
        for conn in [engine.store.conn, *engine.store._readers]:
            conn.set_trace_callback(statements.append)
        for superseded in (ids[3:30:3], ids[::2]):  # 9 rows (walked), then 200 (looked up by id)
            with engine.store.write() as conn:
                conn.executemany("UPDATE memories SET superseded_by = ? WHERE id = ?", [(ids[0], i) for i in superseded])
            del statements[:]
            assert engine.store.superseded_among(asked) == set(asked) & set(superseded)
            walked = [s for s in statements if "json_each" in s]
            assert len(walked) == 1 and ("+id IN" in walked[0]) == (len(superseded) <= store.SUPERSEDED_WALK * len(asked))


@pytest.mark.parametrize("mode", ["report", "skip"])
def test_a_contradicting_near_duplicate_is_a_candidate_never_applied(tmp_path, mode):
    with _engine(tmp_path, dedup_mode=mode) as engine:
        old = engine.save([OLD])["ids"][0]
        result = engine.save([NEW, "Ada prefers tabs over spaces"])
        assert len(result["ids"]) == 2  # saved, even where near-duplicates are skipped
        (candidate,) = result["supersession_candidates"]
        assert (candidate["index"], candidate["supersedes"], candidate["was"], candidate["now"]) == (0, old, ["1.29"], ["1.30"])
        assert "superseded_by" not in engine.get(old)  # reported, not applied
        # Applying it afterwards: the new fact is already stored, so that memory supersedes the old one.
        again = engine.save([{"content": NEW, "supersedes": old}])
        assert again["ids"] == [] and again["skipped"][0] == {"index": 0, "reason": "duplicate", "duplicate_of": result["ids"][0],
                                                              "supersedes": old}
        assert engine.get(old)["superseded_by"] == result["ids"][0]
        # An addition is no contradiction, and neither is the memory it replaces.
        assert "supersession_candidates" not in engine.save(["The staging cluster runs Kubernetes 1.30 with Cilium"])


def test_schema_v8_migrates_once(tmp_path):
    with _engine(tmp_path) as engine:
        engine.save([OLD])
    conn = sqlite3.connect(tmp_path / "memory.db")
    columns = [r[1] for r in conn.execute("PRAGMA table_info(memories)")]
    assert SCHEMA_VERSION == 8 and conn.execute("PRAGMA user_version").fetchone()[0] == 8
    assert {"valid_from", "valid_until", "superseded_by"} <= set(columns)
    schema = conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    MIGRATIONS[8](conn)  # re-running the step changes nothing
    assert conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema
    conn.close()


def test_export_import_keeps_validity_and_relinks_renumbered_ids(tmp_path):
    with _engine(tmp_path, "source") as source:
        old = source.save([OLD])["ids"][0]
        new = source.save([{"content": NEW, "supersedes": old}])["ids"][0]
        text = io.StringIO()
        export_jsonl(source, text)
        records = [json.loads(line) for line in text.getvalue().splitlines()]
        assert next(r for r in records if r.get("id") == old)["superseded_by"] == new
        with _engine(tmp_path, "target") as target:
            target.save(["Two memories already here", "so the imported ids are taken"], session_id="other")
            report = import_jsonl(target, io.StringIO(text.getvalue()))
            assert report.renumbered == {old: 3, new: 4}
            assert target.get(3)["superseded_by"] == 4 and target.get(3)["valid_until"] == source.get(old)["valid_until"]
            assert target.get(4)["valid_from"] == source.get(new)["valid_from"]
            assert [m["id"] for m in target.recall("Kubernetes version of staging", session_id="default")["memories"]] == [4]


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=180)


def test_cli_save_supersedes_and_recall(tmp_path):
    env = {"TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "cli.db"), "TINYCONTEXT_MODELS_DIR": str(tmp_path / "models")}
    assert _cli("save", OLD, env=env).returncode == 0
    candidate = _cli("save", NEW, env=env)
    assert candidate.returncode == 0 and "may supersede id 1 (1.29 -> 1.30)" in candidate.stdout
    applied = _cli("save", "--supersedes", "1", NEW, env=env)
    assert applied.returncode == 0 and "superseded id 1" in applied.stdout
    recall = _cli("recall", "--json", "Kubernetes version staging", env=env)
    assert [m["id"] for m in json.loads(recall.stdout)["memories"]] == [2]
    refused = _cli("save", "--supersedes", "1", "one", "two", env=env)
    assert refused.returncode == 1 and refused.stderr.startswith("invalid_input: --supersedes replaces one memory")


def test_mcp_save_supersedes_over_stdio(tmp_path):
    async def scenario(session):
        first = await session.call_tool("save_memories", {"memories": [{"content": OLD}]})
        old = first.structuredContent["ids"][0]
        second = await session.call_tool("save_memories", {"memories": [{"content": NEW}]})
        assert f"may replace id {old} (1.29 -> 1.30)" in second.content[0].text
        assert second.structuredContent["supersession_candidates"][0]["supersedes"] == old
        third = await session.call_tool("save_memories", {"memories": [{"content": NEW, "supersedes": old}]})
        assert f"supersedes id {old}" in third.content[0].text and not third.isError
        recall = await session.call_tool("recall_memories", {"query": "Kubernetes version of the staging cluster"})
        assert NEW in recall.content[0].text and OLD not in recall.content[0].text
        shown = await session.call_tool("recall_memories", {"query": "Kubernetes version of the staging cluster", "include_superseded": True})
        assert f"superseded by {second.structuredContent['ids'][0]}" in shown.content[0].text
        bad = await session.call_tool("save_memories", {"memories": [{"content": "x", "supersedes": "1"}]})
        assert bad.isError  # strict: an id is an integer

    run_session(server_env(tmp_path), scenario)


def test_rest_save_supersedes(hash_engine):
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base, httpx.Client(base_url=base, timeout=30) as api:
        old = api.post("/save_memories", json={"memories": [{"content": OLD}]}).json()["ids"][0]
        new = api.post("/save_memories", json={"memories": [{"content": NEW, "supersedes": old}]}).json()["saved"][0]
        assert new["supersedes"] == old
        assert api.post("/get_memory", json={"id": old}).json()["superseded_by"] == new["id"]
        current = api.post("/recall_memories", json={"query": "Kubernetes staging"}).json()
        assert [m["id"] for m in current["memories"]] == [new["id"]]
        both = api.post("/recall_memories", json={"query": "Kubernetes staging", "include_superseded": True}).json()
        assert {m["id"]: m.get("superseded_by") for m in both["memories"]} == {new["id"]: None, old: new["id"]}
        missing = api.post("/save_memories", json={"memories": [{"content": "x", "supersedes": 999}]})
        assert missing.status_code == 404 and missing.json()["code"] == "memory_not_found"

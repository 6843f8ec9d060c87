"""Imports from other memory tools (tests/fixtures/imports, hand-written in their formats): what each
format brings in, that importing twice adds nothing, that a dry run counts and changes nothing, and that
a bad record refuses the whole source with its place; through the library and the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import HashEmbedder
from consistency import assert_consistent

import tinycontext
from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.cli.commands import main
from tinycontext.errors import InvalidInputError
from tinycontext.memory.transfer import FORMATS, import_path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "imports"


def _engine(tmp_path, name="target"):
    return MemoryEngine(TinyContextConfig(memory_db_path=tmp_path / f"{name}.db", models_dir=tmp_path / "models"), embedder=HashEmbedder())


def _service_db(tmp_path) -> Path:
    path = tmp_path / "sqlite_vec.db"
    conn = sqlite3.connect(path)
    conn.executescript((FIXTURES / "mcp-memory-service" / "service.sql").read_text())
    conn.commit()
    conn.close()
    return path


def _openmemory_zip(tmp_path) -> Path:
    path = tmp_path / "memories_export_sam.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(FIXTURES / "mem0" / "memories.json", "memories.json")
    return path


def source(name: str, tmp_path) -> Path:
    return {"mcp-memory": lambda: FIXTURES / "mcp-memory" / "memory.jsonl", "mem0": lambda: FIXTURES / "mem0" / "get_all.json",
            "openmemory": lambda: _openmemory_zip(tmp_path), "basic-memory": lambda: FIXTURES / "basic-memory" / "notes",
            "mcp-memory-service": lambda: _service_db(tmp_path)}[name]()


# (fixture, format, imported, ignored): what each fixture holds, counted by hand from the files.
CASES = [("mcp-memory", "mcp-memory", 8, 0), ("mem0", "mem0", 3, 0), ("openmemory", "mem0", 2, 1),
         ("basic-memory", "basic-memory", 10, 0), ("mcp-memory-service", "mcp-memory-service", 2, 1)]


def _rows(engine) -> dict[str, dict]:
    return {m["content"]: m for m in (engine.get(r[0], history=False) for r in engine.store.read("SELECT id FROM memories ORDER BY id"))}


@pytest.mark.parametrize("fixture, fmt, count, ignored", CASES)
def test_each_format_imports_once_and_a_dry_run_changes_nothing(tmp_path, fixture, fmt, count, ignored):
    path = source(fixture, tmp_path)
    with _engine(tmp_path) as engine:
        engine.save(["Something saved before the import"], session_id="mine")
    db = tmp_path / "target.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with _engine(tmp_path) as engine:
        dry = import_path(engine, path, format=fmt, session_id="imported", dry_run=True)
        assert (dry.dry_run, dry.imported, dry.skipped, dry.ignored) == (True, count, 0, ignored)
        assert engine.stats()["memories"] == 1 and [s["session_id"] for s in engine.sessions()] == ["mine"]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # byte for byte
    with _engine(tmp_path) as engine:
        report = import_path(engine, path, format=fmt, session_id="imported")
        assert (report.imported, report.skipped, report.ignored, report.embedded) == (count, 0, ignored, count)
        assert engine.stats()["memories"] == 1 + count
        again = import_path(engine, path, format=fmt, session_id="imported")
        assert (again.imported, again.skipped) == (0, count)
        # Into another session too: the uid names the source record, wherever it went.
        assert import_path(engine, path, format=fmt, session_id="elsewhere").imported == 0
        assert engine.stats()["memories"] == 1 + count
        memories = _rows(engine)
        assert all(m["metadata"]["source"] == fmt for c, m in memories.items() if c != "Something saved before the import")
        assert_consistent(engine)


def test_mcp_memory_maps_entities_observations_and_relations(tmp_path):
    with _engine(tmp_path) as engine:
        import_path(engine, source("mcp-memory", tmp_path), format="mcp-memory")
        memories = _rows(engine)
        ada = memories["Ada_Moreau: Prefers tabs over spaces"]
        assert ada["tags"] == ["person"] and ada["metadata"] == {"source": "mcp-memory", "entity": "Ada_Moreau", "entity_type": "person"}
        assert memories["Lyon (city)"]["tags"] == ["city"]  # an entity without observations is still there
        relation = memories["Ada_Moreau manages releases of Harbor"]
        assert relation["tags"] == ["relation"] and relation["metadata"]["relation"] == "manages_releases_of"
        assert engine.recall("who manages the releases of Harbor", top_k=1)["memories"][0]["id"] == relation["id"]


def test_mem0_keeps_ids_dates_owners_and_categories(tmp_path):
    with _engine(tmp_path) as engine:
        import_path(engine, source("mem0", tmp_path), format="mem0")
        import_path(engine, source("openmemory", tmp_path), format="mem0")
        memories = _rows(engine)
        peanuts = memories["Is vegetarian and allergic to peanuts"]
        assert peanuts["tags"] == ["food", "health"] and peanuts["created_at"] == "2024-07-20T01:50:52.012345-07:00"
        assert peanuts["updated_at"] == "2024-07-21T09:12:03.000000-07:00"
        assert peanuts["metadata"] == {"channel": "chat", "source": "mem0", "source_id": "3f1c9a52-7d0e-4b8e-9a51-2c6f0d7e8a10", "user_id": "alex"}
        assert memories["Plans a trip to Kyoto in April"]["metadata"]["agent_id"] == "travel-planner"
        assert memories["Deploys the billing service with Terraform"]["tags"] == ["work", "tools"]  # OpenMemory's category ids, named
        assert memories["Reviews pull requests every morning before standup"]["metadata"]["state"] == "archived"
        assert "Used to work night shifts" not in memories  # deleted in OpenMemory
        assert engine.recall("peanut allergy", filters={"metadata": {"user_id": "alex"}}, top_k=1)["memories"][0]["id"] == peanuts["id"]


def test_basic_memory_maps_notes_observations_and_relations(tmp_path):
    with _engine(tmp_path) as engine:
        import_path(engine, source("basic-memory", tmp_path), format="basic-memory")
        memories = _rows(engine)
        water = memories["Coffee Brewing Methods: Water at 94 degrees Celsius extracts best"]
        assert water["tags"] == ["technique", "coffee", "brewing"]
        assert water["metadata"] == {"source": "basic-memory", "note": "Coffee Brewing Methods", "permalink": "coffee-brewing-methods",
                                     "note_type": "note", "category": "technique", "context": "for light roasts"}
        assert memories["Coffee Brewing Methods: Ethiopian beans taste of blueberries #flavor #origin"]["tags"] == [
            "preference", "flavor", "origin", "coffee", "brewing"]
        assert memories["Coffee Brewing Methods pairs with Morning Routine"]["metadata"]["context"] == "weekdays only"
        assert memories["Coffee Brewing Methods relates to Espresso Notes"]["metadata"]["relation"] == "relates_to"
        # The folder's path is the permalink when the frontmatter has none; a comma-separated tag list.
        assert memories["Harbor Release Plan owned by Ada Moreau"]["metadata"]["permalink"] == "projects/harbor-release"
        assert memories["Harbor Release Plan: Freeze the release branch on Tuesday at noon #release"]["tags"] == ["decision", "release", "planning"]
        prose = [c for c in memories if c.startswith("Harbor Release Plan\n\n")]
        assert len(prose) == 1 and "- [not] an observation inside a code block" in prose[0]  # code blocks are text
        assert "- [ ] try cold brew next month" in next(c for c in memories if c.startswith("Coffee Brewing Methods\n\n"))
        mtime = (FIXTURES / "basic-memory" / "notes" / "coffee-brewing.md").stat().st_mtime
        assert water["created_at"].startswith(__import__("datetime").datetime.fromtimestamp(mtime, __import__("datetime").timezone.utc)
                                              .isoformat()[:19])


def test_mcp_memory_service_maps_rows_and_skips_soft_deleted(tmp_path):
    with _engine(tmp_path) as engine:
        import_path(engine, source("mcp-memory-service", tmp_path), format="mcp-memory-service")
        memories = _rows(engine)
        k8s = memories["The staging cluster runs Kubernetes 1.29"]
        assert k8s["tags"] == ["infra", "kubernetes"] and k8s["created_at"] == "2024-06-01T10:00:00Z"
        assert k8s["metadata"]["memory_type"] == "fact" and k8s["metadata"]["project"] == "platform"
        credentials = memories["Decided to rotate database credentials every 90 days"]
        assert credentials["created_at"] == "2024-06-11T10:00:00.000000+00:00"  # from Unix seconds when no *_iso
        assert credentials["updated_at"] == "2024-06-12T10:00:00.000000+00:00"
        assert "An obsolete note about the old VPN" not in memories


@pytest.mark.parametrize("fmt, name, text, where", [
    ("mcp-memory", "memory.jsonl", '{"type":"entity","name":"A","entityType":"t","observations":["ok"]}\n{"type":"entity","name":"B"',
     "memory.jsonl:2: not JSON"),
    ("mcp-memory", "memory.jsonl", '{"type":"entity","name":"A","entityType":"t","observations":["ok"]}\n{"type":"entity","name":"B",'
     '"entityType":"t","observations":[1]}', "memory.jsonl:2: observations must be a list of strings"),
    ("mcp-memory", "memory.jsonl", '{"type":"relation","from":"A","to":"B","relationType":"knows"}\n{"type":"node"}',
     "memory.jsonl:2: unknown line type 'node'"),
    ("mem0", "m.json", '{"results": [{"id": "1", "memory": "fine"}, {"id": "2", "memory": "bad date", "created_at": "yesterday"}]}',
     "m.json: results[1]"),
    ("mem0", "m.json", '[{"id": "1", "memory": "fine"}, {"id": "2", "text": "no memory field"}]', "m.json: memories[1]: a mem0 memory needs"),
    ("mem0", "m.jsonl", '{"id": "1", "content": "fine"}\n{"id": "2", "content": ""}\n', "m.jsonl:2"),
])
def test_a_bad_record_imports_nothing_and_names_its_place(tmp_path, fmt, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    with _engine(tmp_path) as engine:
        with pytest.raises(InvalidInputError) as caught:
            import_path(engine, path, format=fmt)
        assert where in caught.value.message
        assert engine.stats()["memories"] == 0


def test_a_bad_note_refuses_the_whole_folder(tmp_path):
    notes = tmp_path / "notes"
    shutil.copytree(FIXTURES / "basic-memory" / "notes", notes)
    (notes / "zz-broken.md").write_text("---\ntitle: [unclosed\n---\n- [idea] never imported\n")
    with _engine(tmp_path) as engine:
        with pytest.raises(InvalidInputError, match=r"zz-broken\.md:\d+: the frontmatter is not valid YAML"):
            import_path(engine, notes, format="basic-memory")
        assert engine.stats()["memories"] == 0
        with pytest.raises(InvalidInputError, match="not an mcp-memory-service database"):
            import_path(engine, tmp_path / "target.db", format="mcp-memory-service")
        with pytest.raises(InvalidInputError, match="Unknown import format 'chatgpt'"):
            import_path(engine, notes, format="chatgpt")


def test_the_public_api_imports(tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "api.db", models_dir=tmp_path / "models", embedding_backend="none")
    try:
        report = tinycontext.import_from(FIXTURES / "mcp-memory" / "memory.jsonl", format="mcp-memory", dry_run=True, config=config)
        assert (report["imported"], report["dry_run"]) == (8, True)
        assert tinycontext.import_from(FIXTURES / "mcp-memory" / "memory.jsonl", format="mcp-memory", config=config)["imported"] == 8
        assert tinycontext.import_from(FIXTURES / "mcp-memory" / "memory.jsonl", format="mcp-memory", config=config)["skipped"] == 8
    finally:
        tinycontext.close_engines()


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("fixture, fmt, count, ignored", CASES)
def test_cli_imports_each_format(env, monkeypatch, capsys, tmp_path, fixture, fmt, count, ignored):
    """The CLI's ``main`` in process, keyword-only (the library tests embed); the real subprocess is the
    next test's (exit code, stderr line, help)."""
    monkeypatch.setenv("TINYCONTEXT_EMBEDDING_BACKEND", "none")
    path = str(source(fixture, tmp_path))

    def cli(*args: str) -> str:
        code = main(list(args))
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    dry = cli("import", "--format", fmt, "--dry-run", path)
    assert dry.startswith(f"Would import {count} memor") and "Dry run: nothing was changed." in dry
    done = json.loads(cli("import", "--format", fmt, "--session", "theirs", "--json", path))
    assert {k: done[k] for k in ("imported", "skipped", "ignored", "format")} == {
        "imported": count, "skipped": 0, "ignored": ignored, "format": fmt}
    assert f"skipped {count} already present" in cli("import", "--format", fmt, path)
    listed = json.loads(cli("sessions", "--json"))
    assert [(s["session_id"], s["memories"]) for s in listed] == [("theirs", count)]


def test_cli_refuses_a_bad_file_with_its_line(tmp_path):
    env = {"TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "cli.db"), "TINYCONTEXT_EMBEDDING_BACKEND": "none"}
    bad = tmp_path / "memory.jsonl"
    bad.write_text('{"type":"entity","name":"A","entityType":"t","observations":["kept?"]}\nnot json\n')
    done = _cli("import", "--format", "mcp-memory", str(bad), env=env)
    assert done.returncode == 1 and done.stderr.startswith(f"invalid_input: {bad}:2: not JSON")
    assert sorted(FORMATS) == sorted(["tinycontext", "mcp-memory", "mem0", "basic-memory", "mcp-memory-service"])
    help_text = _cli("import", "--help", env=env).stdout
    assert all(name in help_text for name in FORMATS)

"""FTS5 maintenance (Store.optimize, `tinycontext optimize`, and after a big import) on real SQLite files: the
index's segments merge into one, searches answer exactly as before, and a reader open meanwhile is unaffected."""

from __future__ import annotations

import io
import json
import sqlite3

from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.cli.commands import main
from tinycontext.memory.imports import base
from tinycontext.memory.transfer import export_jsonl, import_jsonl

WORDS = ["deploy", "billing", "postgres", "standup", "release", "invoice", "cache", "queue"]
QUERIES = ["deploy billing", "postgres cache queue", "release invoice", "standup"]
SCORED = "SELECT rowid, bm25(memories_fts) FROM memories_fts WHERE memories_fts MATCH ? ORDER BY bm25(memories_fts), rowid"


def _engine(tmp_path, name: str = "m.db") -> MemoryEngine:
    config = TinyContextConfig(memory_db_path=tmp_path / name, models_dir=tmp_path / "models", dedup_mode="off")
    return MemoryEngine(config, embedder=HashEmbedder())


def _fill(engine: MemoryEngine, saves: int = 12, name: str = "note") -> None:
    for s in range(saves):  # one transaction, so one new FTS5 segment, per save
        engine.save([f"{WORDS[(s + i) % 8]} {WORDS[(s * 3 + i) % 8]} {name} {s} {i}" for i in range(5)], session_id="s")


def _answers(engine: MemoryEngine) -> list:
    scored = [engine.store.read(SCORED, (" OR ".join(q.split()),)) for q in QUERIES]
    return scored + [[(m["id"], m["content"]) for m in engine.recall(q, session_id="s", top_k=10)["memories"]] for q in QUERIES]


def test_optimize_merges_segments_and_answers_the_same(tmp_path):
    with _engine(tmp_path) as engine:
        _fill(engine)
        before, segments = _answers(engine), engine.store.fts_segments()
        assert segments > 2  # FTS5's automerge leaves several
        result = engine.store.optimize()
        assert result == {"fts_segments_before": segments, "fts_segments": 1}  # episodes_fts is empty: no segment
        assert _answers(engine) == before
        engine.save(["deploy cache added later"], session_id="s")
        assert engine.store.optimize()["fts_segments"] == 1


def test_a_reader_open_during_optimize_keeps_its_snapshot(tmp_path):
    with _engine(tmp_path) as engine:
        _fill(engine)
        reader = sqlite3.connect(str(engine.store.path), isolation_level=None)
        try:
            reader.execute("BEGIN")
            seen = reader.execute(SCORED, ("deploy OR cache",)).fetchall()
            engine.store.optimize()  # WAL: commits while the reader holds its snapshot
            assert reader.execute(SCORED, ("deploy OR cache",)).fetchall() == seen
            reader.execute("COMMIT")
            assert reader.execute(SCORED, ("deploy OR cache",)).fetchall() == seen
        finally:
            reader.close()


def test_a_big_import_ends_optimized_and_a_small_one_does_not(tmp_path, monkeypatch):
    with _engine(tmp_path, "source.db") as source:
        _fill(source, saves=4, name="imported")
        exported = io.StringIO()
        export_jsonl(source, exported)
    for name, threshold, merged in (("small.db", 21, False), ("big.db", 20, True)):
        monkeypatch.setattr(base, "OPTIMIZE_AFTER", threshold)
        with _engine(tmp_path, name) as target:
            _fill(target)
            segments = target.store.fts_segments()
            assert import_jsonl(target, io.StringIO(exported.getvalue())).imported == 20
            assert (target.store.fts_segments() == 1) is merged and target.store.fts_segments() <= segments + 1


def test_cli_optimize(tmp_path, monkeypatch, capsys):
    with _engine(tmp_path) as engine:
        _fill(engine)
        segments = engine.store.fts_segments()
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(tmp_path / "m.db"))
    assert main(["optimize", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"fts_segments_before": segments, "fts_segments": 1}
    assert main(["optimize"]) == 0
    assert capsys.readouterr().out.strip() == "Full-text index: 1 segment merged into 1."
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(tmp_path / "none.db"))
    assert main(["optimize"]) == 1 and capsys.readouterr().err.startswith("storage_error")

"""FTS5 maintenance (Store.optimize, `tinycontext optimize`, and after a big import) on real SQLite files: the
index's segments merge into one, searches answer exactly as before, a reader open meanwhile is unaffected, a
locked database is left as it was, and the merge after an import runs in its own transaction, only when it
pays, and never undoes the import."""

from __future__ import annotations

import io
import json
import logging

from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.cli.commands import main
from tinycontext.errors import StorageError
from tinycontext.memory import store as store_module
from tinycontext.memory.imports import base
from tinycontext.memory.transfer import export_jsonl, import_jsonl
from tinycontext.retrieval import postings

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


def _export(tmp_path) -> str:
    with _engine(tmp_path, "source.db") as source:
        _fill(source, saves=4, name="imported")
        exported = io.StringIO()
        export_jsonl(source, exported)
    return exported.getvalue()


def test_optimize_merges_segments_and_answers_the_same(tmp_path):
    with _engine(tmp_path) as engine:
        _fill(engine)
        before, segments = _answers(engine), engine.store.fts_segments()
        assert segments > 2  # FTS5's automerge leaves several
        result = engine.store.optimize()
        assert result == {"fts_segments_before": segments, "fts_segments": 1, "postings": None}  # episodes_fts is empty: no segment
        assert _answers(engine) == before
        stamp = engine.store.stamp()
        assert engine.store.optimize() == {"fts_segments_before": 1, "fts_segments": 1, "postings": None}
        assert engine.store.stamp() == stamp  # already merged: nothing written, no cached copy dropped
        engine.save(["deploy cache added later"], session_id="s")
        assert engine.store.optimize()["fts_segments"] == 1


def test_a_reader_open_during_optimize_keeps_its_snapshot(tmp_path):
    with _engine(tmp_path) as engine:
        _fill(engine)
        # The store's own SQLite library: two copies in one process do not see each other's file locks.
        reader = engine.store.driver.connect(str(engine.store.path), isolation_level=None)
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
    exported = _export(tmp_path)
    # 20 memories into 60: merged at a threshold of 20 and a share of 0.1; not below the threshold, nor when
    # they are less than the share of the 80 after the import.
    for name, threshold, share, merged in (("small.db", 21, 0.1, False), ("big.db", 20, 0.1, True), ("share.db", 20, 0.3, False)):
        monkeypatch.setattr(base, "OPTIMIZE_AFTER", threshold)
        monkeypatch.setattr(base, "OPTIMIZE_SHARE", share)
        with _engine(tmp_path, name) as target:
            _fill(target)
            assert target.recall("deploy", session_id="s")["memories"]  # the vector copy is loaded
            segments = target.store.fts_segments()
            assert import_jsonl(target, io.StringIO(exported)).imported == 20
            assert (target.store.fts_segments() == 1) is merged and target.store.fts_segments() <= segments + 1
            target.index.sync()  # the merge moved no vector: the copy the import kept is still current, not dropped
            assert target.index.size == 80


def test_a_big_import_builds_the_postings_snapshot_only_from_its_own_size(tmp_path, monkeypatch):
    """`optimize` builds the BM25 postings snapshot from postings.MIN_MEMORIES; an import's own optimize, which runs
    inside the import call, only from postings.IMPORT_MIN_MEMORIES."""
    exported = _export(tmp_path)
    monkeypatch.setattr(base, "OPTIMIZE_AFTER", 20)
    monkeypatch.setattr(postings, "MIN_MEMORIES", 10)
    for name, import_min, built in (("below.db", 81, False), ("at.db", 80, True)):
        monkeypatch.setattr(postings, "IMPORT_MIN_MEMORIES", import_min)
        with _engine(tmp_path, name) as target:
            _fill(target)
            assert import_jsonl(target, io.StringIO(exported)).imported == 20
            assert target.store.fts_segments() == 1 and (target.stats()["bm25_postings"] is not None) is built
            assert target.store.optimize()["postings"]["memories"] == 80  # asked for: from MIN_MEMORIES


def test_an_import_inside_a_callers_transaction_is_not_merged_there(tmp_path, monkeypatch):
    exported = _export(tmp_path)
    monkeypatch.setattr(base, "OPTIMIZE_AFTER", 20)
    with _engine(tmp_path, "t.db") as target:
        _fill(target, saves=6)  # few enough segments that FTS5's own merging leaves several
        segments = target.store.fts_segments()
        with target.index.write():
            assert import_jsonl(target, io.StringIO(exported)).imported == 20
        assert 1 < target.store.fts_segments() <= segments + 1


def test_a_failed_merge_after_an_import_keeps_the_import(tmp_path, monkeypatch, caplog):
    exported = _export(tmp_path)
    monkeypatch.setattr(base, "OPTIMIZE_AFTER", 20)
    with _engine(tmp_path, "t.db") as target:
        _fill(target)

        def locked(**_):
            raise StorageError("Database t.db: database is locked")

        monkeypatch.setattr(target.store, "optimize", locked)
        with caplog.at_level(logging.WARNING, logger=base.__name__):
            assert import_jsonl(target, io.StringIO(exported)).imported == 20
        assert target.store.count_memories() == 80
        assert [r.getMessage() for r in caplog.records if "tinycontext optimize" in r.getMessage()]


def test_cli_optimize(tmp_path, monkeypatch, capsys):
    with _engine(tmp_path) as engine:
        _fill(engine)
        segments = engine.store.fts_segments()
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(tmp_path / "m.db"))
    assert main(["optimize", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"fts_segments_before": segments, "fts_segments": 1, "postings": None}
    assert main(["optimize"]) == 0
    assert capsys.readouterr().out.strip() == "Full-text index: 1 segment merged into 1."
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(tmp_path / "none.db"))
    assert main(["optimize"]) == 1 and capsys.readouterr().err.startswith("storage_error")


def test_cli_optimize_on_a_database_another_writer_holds(tmp_path, monkeypatch, capsys):
    with _engine(tmp_path) as engine:
        _fill(engine)
        segments = engine.store.fts_segments()
        monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 200)  # the CLI's store waits 0.2 s, not 10
        monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(tmp_path / "m.db"))
        with engine.store.write():  # another writer (this engine) holds the write lock throughout
            assert main(["optimize"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("storage_error") and "locked" in err
        assert engine.store.fts_segments() == segments  # nothing changed

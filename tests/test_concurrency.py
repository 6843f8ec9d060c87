"""Several processes writing one database file at once, and threads sharing one engine."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time

from conftest import suite_embedder
from consistency import assert_consistent
from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.retrieval.filters import Filters

PROCESSES = 4
SAVES = 25


def _worker(db_path: str, worker: int, barrier, results) -> None:
    """Runs in a spawned process: open the (possibly new) database and save one memory per call."""
    try:
        barrier.wait(timeout=120)  # all workers open and write at the same moment
        config = TinyContextConfig(memory_db_path=db_path, models_dir=db_path + ".models")
        acked = []
        with MemoryEngine(config, embedder=suite_embedder()) as eng:
            for i in range(SAVES):
                content = f"worker {worker} memory {i} about topic{i % 5}"
                out = eng.save([{"content": content, "tags": [f"w{worker}"]}], session_id=f"s{worker % 2}")
                acked += [(mid, content) for mid in out["ids"]]
                if i % 5 == 0:
                    eng.recall(f"topic{i % 5} memory", top_k=5)
        results.put((worker, acked, None))
    except BaseException as exc:  # report instead of dying silently
        results.put((worker, [], repr(exc)))


def test_processes_write_one_file_at_once(tmp_path):
    db = str(tmp_path / "shared.db")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(db, w, barrier, results)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[2] for r in reports] == [None] * PROCESSES

    acked = [pair for r in reports for pair in r[1]]
    assert len(acked) == PROCESSES * SAVES
    ids = [mid for mid, _ in acked]
    assert len(set(ids)) == len(ids)
    with MemoryEngine(TinyContextConfig(memory_db_path=db, models_dir=tmp_path / "models"), embedder=suite_embedder()) as eng:
        # Every acknowledged id exists exactly once, with its content, FTS row, tags and vector.
        assert assert_consistent(eng) == dict(acked)
        # Each worker's memories are all findable through its tag, on both retrieval sides.
        for w in range(PROCESSES):
            for weight in (0.0, 1.0):
                found = eng.recall("memory about topic0 topic1 topic2 topic3 topic4 worker", tags=[f"w{w}"], top_k=100, max_tokens=100_000, dense_weight=weight, score_cliff=0.0)
                assert len(found["memories"]) == SAVES


def test_threads_share_one_engine(engine):
    """The real model, so the ONNX embedder's own locking is exercised too."""
    errors: list[BaseException] = []
    saved: list[int] = []
    start = threading.Barrier(4)

    def saver(n: int) -> None:
        try:
            start.wait(timeout=30)
            for i in range(10):
                saved.extend(engine.save([f"thread {n} note {i}"], session_id="t")["ids"])
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            start.wait(timeout=30)
            for i in range(10):
                # The seed note exists before the threads start: concurrent saves must not hide it or
                # hand back a row whose text differs from the stored one.
                out = engine.recall("thread seed note", session_id="t", top_k=5)
                assert out["memories"][0]["id"] == seed, out["memories"][:1]
                for m in out["memories"]:
                    assert engine.get(m["id"], history=False)["content"] == m["content"]
                assert [m["rank"] for m in out["memories"]] == list(range(1, len(out["memories"]) + 1))
                engine.stats()
        except BaseException as exc:
            errors.append(exc)

    seed = engine.save(["thread seed note"], session_id="t")["ids"][0]
    threads = [threading.Thread(target=saver, args=(n,)) for n in range(2)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert errors == []
    assert len(saved) == len(set(saved)) == 20
    assert len(assert_consistent(engine)) == 21


def test_memory_facts_are_kept_while_the_store_is_unchanged(tmp_path, monkeypatch):
    """What recall reads about candidates (episode, speaker, tokens, session) is read once while nothing writes: the
    re-rankers' and the page's reads share it, and the BM25 worker reads its hits' while the dense search runs. Any
    write, by this engine or another connection, makes the next read go to the database."""
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=suite_embedder()) as eng:
        ids = eng.save([f"note {i} about topic{i % 3}" for i in range(20)] + [{"content": "a turn about topic1", "speaker": "Ada"}],
                       session_id="s")["ids"]
        search = eng.candidate_search
        reads: list[str] = []
        for conn in [eng.store.conn, *eng.store._readers]:
            conn.set_trace_callback(lambda sql: reads.append(sql) if "episode_id, speaker, tokens" in sql else None)
        episode = eng.store.read("SELECT episode_id FROM memories WHERE id = ?", (ids[-1],))[0][0]
        assert search.turns(ids) == {ids[-1]: (episode, "Ada")}
        assert search.costs(ids[:3]) == {i: (t, "s") for i, t in eng.store.read("SELECT id, tokens FROM memories WHERE id <= ?", (ids[2],))}
        assert len(reads) == 1
        eng.update(ids[0], "a much longer note about topic0 than it was before")
        eng.delete(ids[1])
        costs = search.costs(ids[:3])
        assert len(reads) == 2 and ids[1] not in costs
        assert costs[ids[0]][0] == eng.get(ids[0], history=False)["tokens"]
        other = sqlite3.connect(tmp_path / "m.db")
        with other:
            other.execute("UPDATE memories SET speaker = 'Bo' WHERE id = ?", (ids[2],))
        other.close()
        assert search.turns(ids[:3]) == {ids[2]: (None, "Bo")} and len(reads) == 3
        dense = search._dense_stage
        monkeypatch.setattr(search, "_dense_stage", lambda *a: time.sleep(0.5) or dense(*a))
        eng.save(["one more note about topic2"], session_id="s")
        found = search.search("topic2 note", "s", [], Filters(), 100, keyword=True, dense=True)
        assert found.bm25 and {i for i, _ in found.bm25} <= set(search._facts)  # read by the BM25 worker during the dense search

"""Edits race saves, deletes and other edits (threads and processes): nothing is lost or reverted,
and text, FTS row and vector always agree. ``expected_version`` turns a stale edit into ``conflict``."""

from __future__ import annotations

import multiprocessing
import random
import threading

import pytest
from conftest import HashEmbedder
from consistency import assert_consistent

from tinycontext import ConflictError, MemoryEngine, MemoryNotFoundError, TinyContextConfig

MEMORIES = 6
ROUNDS = 20


def _content(mid: int, rev: int) -> str:
    return f"memory {mid} revision {rev} about alpha{mid} beta{rev}"


def _race(engine: MemoryEngine, ids: list[int], role: str, seed: int, last_rev: dict, errors: list) -> None:
    """content: the only writer of its memories' text (increasing revisions); tags: tags-only edits of
    every memory; churn: saves and deletes its own memories."""
    rng = random.Random(seed)
    try:
        for rev in range(1, ROUNDS + 1):
            if role.startswith("content"):
                for mid in ids:
                    engine.update(mid, _content(mid, rev))
                    last_rev[mid] = rev
            elif role == "tags":
                mid = rng.choice(ids)
                engine.update(mid, tags=[f"t{rev}", "edited"])
                engine.update(mid, metadata={"rev": rev})
            else:
                saved = engine.save([f"churn {seed} {rev} gamma"], session_id="race")["ids"]
                if saved and rng.random() < 0.5:
                    engine.delete(saved[0])
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        errors.append(exc)


def _seed(engine: MemoryEngine) -> list[int]:
    return engine.save([_content(i, 0) for i in range(MEMORIES)], session_id="race")["ids"]


def _check(engine: MemoryEngine, ids: list[int], last_rev: dict) -> None:
    contents = assert_consistent(engine)
    for mid in ids:
        # A tags-only edit read outside the lock would write an older text back.
        assert contents[mid] == _content(mid, last_rev[mid]), (mid, contents[mid])
        memory = engine.get(mid)
        assert memory["version"] == len(memory["history"]) + 1


def test_threads_race_edits(hash_engine):
    ids = _seed(hash_engine)
    last_rev = {mid: 0 for mid in ids}
    errors: list = []
    roles = [("content-a", ids[:3]), ("content-b", ids[3:]), ("tags", ids), ("tags", ids), ("churn", ids)]
    threads = [threading.Thread(target=_race, args=(hash_engine, mids, role, n, last_rev, errors)) for n, (role, mids) in enumerate(roles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive()
    assert errors == []
    _check(hash_engine, ids, last_rev)


def _process(db: str, ids: list[int], role: str, seed: int, barrier, results) -> None:
    last_rev: dict = {}
    errors: list = []
    config = TinyContextConfig(memory_db_path=db, models_dir=db + ".models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        barrier.wait(timeout=120)
        _race(engine, ids, role, seed, last_rev, errors)
    results.put((last_rev, [repr(e) for e in errors]))


def test_processes_race_edits(tmp_path):
    db = str(tmp_path / "race.db")
    config = TinyContextConfig(memory_db_path=db, models_dir=db + ".models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        ids = _seed(engine)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    roles = [("content-a", ids[:3]), ("content-b", ids[3:]), ("tags", ids), ("churn", ids)]
    procs = [ctx.Process(target=_process, args=(db, mids, role, n, barrier, results)) for n, (role, mids) in enumerate(roles)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[1] for r in reports] == [[]] * len(procs)
    last_rev = {mid: 0 for mid in ids}
    for revs, _ in reports:
        last_rev.update(revs)
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        _check(engine, ids, last_rev)


def test_expected_version_refuses_stale_edits(hash_engine):
    mid = hash_engine.save(["The release is on Friday."])["ids"][0]
    assert hash_engine.update(mid, "The release is on Monday.", expected_version=1)["version"] == 2
    before = hash_engine.get(mid)
    with pytest.raises(ConflictError) as stale:
        hash_engine.update(mid, tags=["late"], expected_version=1)
    assert stale.value.code == "conflict" and "version 2" in stale.value.message
    assert hash_engine.get(mid) == before  # nothing changed
    with pytest.raises(MemoryNotFoundError):
        hash_engine.update(10_000, "x", expected_version=1)
    assert hash_engine.update(mid, tags=["late"], expected_version=2)["tags"] == ["late"]
    assert_consistent(hash_engine)


def test_conflict_over_rest_and_mcp(hash_engine):
    import httpx

    from tinycontext.servers.fastapi_server import create_app
    from tinycontext.servers.http import ServeSettings, background

    mid = hash_engine.save(["Standup moved to 10:00."])["ids"][0]
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        stale = httpx.post(base + "/update_memory", json={"id": mid, "content": "Standup at 11:00.", "expected_version": 7})
        assert (stale.status_code, stale.json()["code"]) == (409, "conflict")
        ok = httpx.post(base + "/update_memory", json={"id": mid, "content": "Standup at 11:00.", "expected_version": 1})
        assert ok.status_code == 200 and ok.json()["version"] == 2
    assert hash_engine.get(mid)["content"] == "Standup at 11:00."


class _SlowCounter:
    """Token counter that stalls the thread named 'tagger': widens whatever window an edit leaves
    between reading a memory and writing it, so a read outside the write lock shows up every time."""

    def __init__(self, inner):
        self.inner = inner

    def count(self, text):
        if threading.current_thread().name == "tagger":
            threading.Event().wait(0.3)
        return self.inner.count(text)

    def count_many(self, texts):
        return self.inner.count_many(texts)


def test_tags_only_edit_never_reverts_a_concurrent_text_edit(hash_engine):
    mid = hash_engine.save(["Deploys go to Heroku."])["ids"][0]
    hash_engine.tokens = _SlowCounter(hash_engine.tokens)
    tagger = threading.Thread(target=hash_engine.update, args=(mid,), kwargs={"tags": ["infra"]}, name="tagger")
    tagger.start()
    threading.Event().wait(0.1)
    hash_engine.update(mid, "Deploys go to Fly.io.")
    tagger.join(timeout=30)
    memory = hash_engine.get(mid)
    assert (memory["content"], memory["tags"], memory["version"]) == ("Deploys go to Fly.io.", ["infra"], 3)
    assert_consistent(hash_engine)

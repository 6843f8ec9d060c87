"""The in-RAM vector copy (tinycontext/memory/vector_index.py): same dense results as sqlite-vec, kept
exact under the engine's own writes, other connections' and processes' writes, imports, reindex."""

from __future__ import annotations

import hashlib
import io
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import REPO, HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.memory import codes, float_block, vector_index
from tinycontext.memory.transfer import export_jsonl, import_jsonl

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike",
         "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]
SESSIONS = ("a", "b", "c")
TAGS = ("t1", "t2", "t3")


class SpreadEmbedder(HashEmbedder):
    """Each text gets its own pseudo-random direction: no ties between scores, so rankings are
    comparable exactly. ``salt`` gives a different embedder (for reindex)."""

    def __init__(self, dimensions: int = 48, salt: str = ""):
        super().__init__(dimensions, model=f"spread{salt}")
        self.salt = salt

    def _one(self, text: str) -> np.ndarray:
        seed = int(hashlib.md5((self.salt + text).encode()).hexdigest()[:8], 16)
        vec = np.random.default_rng(seed).standard_normal(self.dimensions).astype(np.float32)
        return vec / np.linalg.norm(vec)


def _config(path, **extra) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=path, models_dir=path.parent / "models", **extra)


def _fill(engine: MemoryEngine, count: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for session in SESSIONS:
        items = [{"content": f"{session} {i} " + " ".join(rng.choices(WORDS, k=6)),
                  "tags": rng.sample(TAGS, rng.randrange(3))} for i in range(count)]
        engine.save(items, session_id=session)


def _oracle(engine: MemoryEngine, query: str, session, tags, k) -> list[tuple[int, float]]:
    """Brute force from the stored rows: cosine, best first, ties by id."""
    sql = "SELECT memory_id, embedding FROM memory_vectors"
    rows = engine.store.read(sql + " WHERE session_id = ?", (session,)) if session else engine.store.read(sql)
    if tags:
        allowed = {r[0] for r in engine.store.read(f"SELECT memory_id FROM memory_tags WHERE tag IN ({','.join('?' * len(tags))})", tags)}
        rows = [r for r in rows if r[0] in allowed]
    q = engine.embedder.embed_query(query)
    q = q / np.linalg.norm(q)
    scored = []
    for mid, blob in rows:
        v = np.frombuffer(blob, np.float32)
        scored.append((mid, float(v @ q / np.linalg.norm(v))))
    return sorted(scored, key=lambda s: (-s[1], s[0]))[:k]


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    """The same rows in the same order, except that two rows whose cosines agree to float32 rounding may swap: the
    oracle's dot products and the index's matrix products sum in orders that depend on the CPU's BLAS kernels (a 1-ulp
    difference broke an exact tie differently on one machine). A row ranked by its fp16 copy alone would be off by far more."""
    assert len({g[0] for g in got}) == len(got) == len(want)
    assert np.allclose([g[1] for g in got], [w[1] for w in want], atol=1e-5)
    for (g, g_score), (w, w_score) in zip(got, want):
        assert g == w or abs(g_score - w_score) <= 1e-6, (got, want)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """One database of 3 sessions x 150 memories with tags, built once."""
    path = tmp_path_factory.mktemp("vi") / "memory.db"
    with MemoryEngine(_config(path), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 150)
    return path


@pytest.mark.parametrize("cache_max", [500_000, 0])
@pytest.mark.parametrize("session", [None, "a", "c"])
@pytest.mark.parametrize("tags", [[], ["t2"], ["t1", "t3"]])
def test_dense_equals_brute_force(filled, cache_max, session, tags):
    with MemoryEngine(_config(filled, vector_cache_max=cache_max), embedder=SpreadEmbedder()) as eng:
        for query in ("alpha bravo", "zulu tango lima"):
            for depth in (7, 100, 1000):
                _same(eng.candidate_search.dense(query, session, tags, depth), _oracle(eng, query, session, tags, depth))
        assert (eng.index.size > 0) == (cache_max > 0)


def test_recall_same_with_and_without_cache(filled):
    with MemoryEngine(_config(filled), embedder=SpreadEmbedder()) as cached, \
            MemoryEngine(_config(filled, vector_cache_max=0), embedder=SpreadEmbedder()) as plain:
        for session in (None, "b"):
            for weight in (0.5, 1.0):
                args = {"session_id": session, "tags": ["t1"], "top_k": 30, "max_tokens": 100_000, "dense_weight": weight}
                got, want = cached.recall("kilo mike oscar", **args), plain.recall("kilo mike oscar", **args)
                assert [m["id"] for m in got["memories"]] == [m["id"] for m in want["memories"]]
                assert np.allclose([m["scores"]["dense"] or 0 for m in got["memories"]],
                                   [m["scores"]["dense"] or 0 for m in want["memories"]], atol=1e-5)
        assert cached.index.size == 450 and plain.index.size == 0


def test_real_model_same_as_sqlite_vec(tmp_path, real_embedder):
    texts = [f"{who} talked about {what} on day {d}." for who in ("Anna", "Bo", "Cy") for what in
             ("hiking trails", "a new job", "her cat", "painting", "the book club", "moving house") for d in (1, 2, 3)]
    with MemoryEngine(_config(tmp_path / "m.db"), embedder=real_embedder) as cached, \
            MemoryEngine(_config(tmp_path / "m.db", vector_cache_max=0), embedder=real_embedder) as plain:
        cached.save(texts, session_id="s")
        for query in ("who changed jobs?", "pets"):
            for session in ("s", None):
                got, want = cached.candidate_search.dense(query, session, [], 20), plain.candidate_search.dense(query, session, [], 20)
                _same(got, want)
                _same(got, _oracle(cached, query, session, [], 20))


def test_own_writes_update_the_copy_in_place(tmp_path):
    with MemoryEngine(_config(tmp_path / "m.db"), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 20)
        eng.candidate_search.dense("warm", "a", [], 10)
        block = eng.index._blocks["a"]
        new = eng.save(["a fresh memory about quebec"], session_id="a")["ids"][0]
        assert eng.candidate_search.dense("a fresh memory about quebec", "a", [], 1)[0][0] == new
        assert eng.index._blocks["a"] is block and block.n == 21  # appended, not reloaded

        target = eng.candidate_search.dense("alpha", "a", [], 5)[-1][0]
        eng.update(target, "alpha alpha alpha")
        assert eng.candidate_search.dense("alpha alpha alpha", "a", [], 1)[0] == (target, pytest.approx(1.0, abs=1e-5))
        eng.delete(new)
        assert new not in [h[0] for h in eng.candidate_search.dense("a fresh memory about quebec", "a", [], 100)]
        assert eng.index._blocks["a"] is block and block.n == 20
        for query in ("alpha", "quebec romeo"):
            _same(eng.candidate_search.dense(query, "a", [], 50), _oracle(eng, query, "a", [], 50))


def test_copy_across_all_sessions_follows_new_sessions(tmp_path):
    with MemoryEngine(_config(tmp_path / "m.db"), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 10)
        eng.candidate_search.dense("warm", None, [], 10)
        new = eng.save(["first memory of a new session"], session_id="new")["ids"][0]
        assert eng.candidate_search.dense("first memory of a new session", None, [], 1)[0][0] == new
        assert eng.index._complete


def test_failed_write_leaves_the_copy_exact(tmp_path):
    with MemoryEngine(_config(tmp_path / "m.db"), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 10)
        eng.candidate_search.dense("warm", "a", [], 5)
        with pytest.raises(RuntimeError), eng.index.write() as conn:
            conn.execute("DELETE FROM memory_vectors WHERE session_id = 'a'")
            eng.index.remove("a", 1)
            raise RuntimeError("boom")
        _same(eng.candidate_search.dense("alpha", "a", [], 10), _oracle(eng, "alpha", "a", [], 10))
        assert len(eng.candidate_search.dense("alpha", "a", [], 100)) == 10


def test_edits_outside_write_are_refused(hash_engine):
    with pytest.raises(RuntimeError, match="inside VectorIndex.write"):
        hash_engine.index.remove("default", 1)


def test_writes_by_another_connection_are_seen(tmp_path):
    path = tmp_path / "m.db"
    with MemoryEngine(_config(path), embedder=SpreadEmbedder()) as a, MemoryEngine(_config(path), embedder=SpreadEmbedder()) as b:
        _fill(a, 20)
        for session in ("a", None):
            a.candidate_search.dense("warm", session, [], 5)
            new = b.save([f"from b into {session}"], session_id="a")["ids"][0]
            assert a.candidate_search.dense(f"from b into {session}", session, [], 1)[0][0] == new
            b.update(new, "changed by b")
            assert a.candidate_search.dense("changed by b", session, [], 1)[0] == (new, pytest.approx(1.0, abs=1e-5))
            b.delete(new)
            assert new not in [h[0] for h in a.candidate_search.dense("changed by b", session, [], 100)]
            _same(a.candidate_search.dense("alpha", session, ["t1"], 30), _oracle(a, "alpha", session, ["t1"], 30))


def test_writes_by_another_process_are_seen(tmp_path):
    path = tmp_path / "m.db"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / 'tests')!r})
        from test_vector_index import SpreadEmbedder, _config
        from tinycontext import MemoryEngine
        with MemoryEngine(_config(__import__('pathlib').Path({str(path)!r})), embedder=SpreadEmbedder()) as eng:
            new = eng.save(["written by another process"], session_id="a")["ids"][0]
            eng.update(1, "rewritten by another process")
            eng.delete(2)
            print(new)
    """)
    with MemoryEngine(_config(path), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 20)
        assert {h[0] for h in eng.candidate_search.dense("warm", "a", [], 100)} >= {1, 2}
        new = int(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, cwd=REPO).stdout)
        assert eng.candidate_search.dense("written by another process", "a", [], 1)[0][0] == new
        assert eng.candidate_search.dense("rewritten by another process", "a", [], 1)[0] == (1, pytest.approx(1.0, abs=1e-5))
        assert 2 not in [h[0] for h in eng.candidate_search.dense("alpha", "a", [], 100)]
        _same(eng.candidate_search.dense("alpha", "a", [], 100), _oracle(eng, "alpha", "a", [], 100))


def test_reindex_and_import_drop_the_copy(tmp_path):
    with MemoryEngine(_config(tmp_path / "m.db"), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 15)
        eng.candidate_search.dense("warm", None, [], 5)
        other = SpreadEmbedder(salt="v2")
        assert eng.store.bind_embedder(other.identity, reindex="auto", embed_all=other.embed_documents) == 45
        eng._embedder = other
        _same(eng.candidate_search.dense("alpha", None, [], 20), _oracle(eng, "alpha", None, [], 20))

        with MemoryEngine(_config(tmp_path / "src.db"), embedder=other) as src:
            src.save(["imported memory one", "imported memory two"], session_id="a")
            dump = io.StringIO()
            export_jsonl(src.store, dump)
        import_jsonl(eng, io.StringIO(dump.getvalue()))
        hits = eng.candidate_search.dense("imported memory two", "a", [], 3)
        assert eng.get(hits[0][0])["content"] == "imported memory two"
        _same(hits, _oracle(eng, "imported memory two", "a", [], 3))


def test_sessions_over_the_limit_use_sqlite_vec(tmp_path):
    with MemoryEngine(_config(tmp_path / "m.db", vector_cache_max=25, vector_quantized_max=0), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 20)
        eng.save([f"extra {i}" for i in range(10)], session_id="a")  # a: 30 > 25
        for session in ("a", None, "b", "c"):
            _same(eng.candidate_search.dense("alpha golf", session, ["t2"], 40), _oracle(eng, "alpha golf", session, ["t2"], 40))
        assert list(eng.index._blocks) == ["c"]  # b was evicted to make room for c; a never fit
        eng.save([f"more {i}" for i in range(10)], session_id="c")  # grows past the limit: dropped
        assert eng.index.size == 0
        _same(eng.candidate_search.dense("more 3", "c", [], 5), _oracle(eng, "more 3", "c", [], 5))


def _saves(path, embedder, batches, **config):
    with MemoryEngine(_config(path, **config), embedder=embedder) as eng:
        return [eng.save(batch, session_id="s") for batch in batches]


@pytest.mark.parametrize("mode", ["report", "skip"])
def test_near_duplicate_reports_unchanged(tmp_path, monkeypatch, mode):
    batches = [
        [f"{w} {v} notes" for w in WORDS[:12] for v in WORDS[12:16]],
        ["Alpha mike notes!", "golf tango notes?", "Golf tango notes.", "brand new words here", "zulu yankee"],
        ["Golf PAPA notes", "brand new words here!", "golf oscar notes"],
    ]
    monkeypatch.setattr(vector_index, "NEAREST_CHUNK", 100)  # several slices per batch
    cached = _saves(tmp_path / "c.db", HashEmbedder(), batches, dedup_mode=mode)
    plain = _saves(tmp_path / "p.db", HashEmbedder(), batches, dedup_mode=mode, vector_cache_max=0)
    for got, want in zip(cached, plain):
        assert got["near_duplicates"] == want["near_duplicates"] and got["skipped"] == want["skipped"]
        assert [(d["similar_to"], d["similarity"]) for d in got["near_duplicates"]] == \
               [(d["similar_to"], d["similarity"]) for d in want["near_duplicates"]]
    # Index 0 has a stored neighbour, index 2 one saved earlier in the same call: both are found.
    second = cached[1]
    flagged = {d["index"]: d["similar_to"] for d in second["near_duplicates"] + second["skipped"] if "similar_to" in d}
    assert flagged[0] not in second["ids"] and flagged[2] in second["ids"]


def test_near_duplicates_real_model(tmp_path, real_embedder):
    batches = [["The meeting moved to Tuesday at 3 pm.", "Bo adopted a grey cat named Pixel."],
               ["The meeting was moved to Tuesday, 3pm.", "Bo adopted a gray cat called Pixel.", "Totally unrelated: the sky."]]
    with MemoryEngine(_config(tmp_path / "c.db", dedup_threshold=0.85), embedder=real_embedder) as cached, \
            MemoryEngine(_config(tmp_path / "p.db", dedup_threshold=0.85, vector_cache_max=0), embedder=real_embedder) as plain:
        (first_c, first_p), (second_c, second_p) = [(cached.save(b, session_id="s"), plain.save(b, session_id="s")) for b in batches]
    assert first_c == first_p
    assert [d["similar_to"] for d in second_c["near_duplicates"]] == [d["similar_to"] for d in second_p["near_duplicates"]]
    assert np.allclose([d["similarity"] for d in second_c["near_duplicates"]], [d["similarity"] for d in second_p["near_duplicates"]], atol=2e-4)
    assert second_c["near_duplicates"]


def test_nearest_tie_reports_the_oldest(hash_engine):
    first = hash_engine.save(["kilo lima notes"])["ids"][0]
    hash_engine.save(["Kilo lima notes!", "zulu"])
    hash_engine.save(["lima zulu"])  # a delete reorders the copy's rows
    hash_engine.delete(first + 2)
    report = hash_engine.save(["KILO LIMA NOTES"])["near_duplicates"]
    assert report == [{"index": 0, "similar_to": first, "similarity": 1.0}]


def test_emptied_session_has_no_dense_hits(hash_engine):
    only = hash_engine.save(["lonely memory"], session_id="solo")["ids"][0]
    assert hash_engine.candidate_search.dense("lonely memory", "solo", [], 5)[0][0] == only
    hash_engine.delete(only)
    assert hash_engine.candidate_search.dense("lonely memory", "solo", [], 5) == []
    assert hash_engine.recall("lonely memory", session_id="solo")["memories"] == []


def _overlap(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> float:
    return len({g[0] for g in got} & {w[0] for w in want}) / max(1, len(want))


@pytest.mark.parametrize("tags", [[], ["t2"]])
def test_quantized_session_close_to_brute_force(filled, monkeypatch, tags):
    """Sessions over vector_cache_max are held as sign bits + int8 codes: the top hits are those
    of exact search and the scores within int8 error of the exact cosines."""
    monkeypatch.setattr(vector_index, "RESCORE_MIN", 100)  # a real pre-selection out of 150 (48 random bits: weak)
    with MemoryEngine(_config(filled, vector_cache_max=100), embedder=SpreadEmbedder()) as eng:
        overlaps = []
        for query in ("alpha bravo", "zulu tango lima", "kilo", "mike november oscar papa"):
            for depth in (5, 20):
                got, want = eng.candidate_search.dense(query, "a", tags, depth), _oracle(eng, query, "a", tags, depth)
                overlaps.append(_overlap(got, want))
                exact = dict(_oracle(eng, query, "a", tags, 1000))
                assert all(abs(score - exact[mid]) < 0.02 for mid, score in got)
                assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
        assert np.mean(overlaps) >= 0.9
        assert eng.index.quantized_size == 150 and eng.index.size == 0
        _same(eng.candidate_search.dense("alpha", None, [], 10), _oracle(eng, "alpha", None, [], 10))  # 450 > 100: sqlite-vec


def test_exact_max_splits_float_and_two_stage_sessions(filled, monkeypatch):
    """vector_exact_max: a session above it is searched in two stages although vector_cache_max could hold its floats;
    searches across all sessions still use the float rows (450 <= vector_cache_max); without two-stage search
    (vector_quantized_max 0) the session stays exact."""
    monkeypatch.setattr(vector_index, "RESCORE_MIN", 100)
    with MemoryEngine(_config(filled, vector_exact_max=100), embedder=SpreadEmbedder()) as eng:
        got, want = eng.candidate_search.dense("zulu tango lima", "a", [], 10), _oracle(eng, "zulu tango lima", "a", [], 10)
        assert _overlap(got, want) >= 0.8 and eng.index.quantized_size == 150 and eng.index.size == 0
        _same(eng.candidate_search.dense("alpha", None, [], 10), _oracle(eng, "alpha", None, [], 10))
        assert eng.index.size == 450
    for update in ({"vector_exact_max": 150}, {"vector_exact_max": 100, "vector_quantized_max": 0}):
        with MemoryEngine(_config(filled, **update), embedder=SpreadEmbedder()) as eng:
            _same(eng.candidate_search.dense("kilo", "b", [], 10), _oracle(eng, "kilo", "b", [], 10))
            assert eng.index.size == 150 and eng.index.quantized_size == 0


def test_half_precision_ranking_gives_the_float_top_k(tmp_path, monkeypatch):
    """Float blocks of HALF_MIN rows or more rank from their fp16 copy and rescore the rows near the k-th: the same
    top k as the float scan, through appends, edits and deletes, and with exact ties (duplicate vectors: by id)."""
    monkeypatch.setattr(float_block, "HALF_MIN", 64)
    with MemoryEngine(_config(tmp_path / "m.db"), embedder=SpreadEmbedder()) as eng:
        _fill(eng, 120)
        eng.save(["a 0 " + " ".join(WORDS[:6])] * 1 + ["twin " + w for w in WORDS], session_id="a")
        for query in ("alpha bravo", "zulu tango lima", "twin kilo"):
            for session in ("a", None):
                for depth in (1, 10, 30):
                    _same(eng.candidate_search.dense(query, session, [], depth), _oracle(eng, query, session, [], depth))
        block = eng.index._blocks["a"]
        assert block._half is not None and block._half.ntotal == block.n
        eng.save(["a later memory about oscar"], session_id="a")
        ids = [m for m, _ in eng.candidate_search.dense("oscar", "a", [], 20)]
        assert block._half.ntotal == block.n  # extended, not rebuilt
        eng.update(ids[3], "papa papa papa")
        eng.delete(ids[0])
        for query in ("papa papa papa", "oscar", "alpha"):
            _same(eng.candidate_search.dense(query, "a", [], 25), _oracle(eng, query, "a", [], 25))
    # 60 rows tie for the query's top 12; 160 more whose cosines differ by less than fp16 rounding, which orders them
    # differently from float32 (and puts more of them near the 12th than the first fp16 depth, k + 64, holds): only the
    # rescored border, searched deeper, gets their top 12 right.
    rng = np.random.default_rng(5)
    base = rng.standard_normal(32).astype(np.float32)
    table = {f"t{i}": np.eye(32, dtype=np.float32)[i % 2] for i in range(60)}
    table |= {f"c{i}": base + 3e-4 * np.abs(base).mean() * rng.standard_normal(32).astype(np.float32) for i in range(160)}
    table |= {"q": np.eye(32, dtype=np.float32)[1], "near": base + rng.standard_normal(32).astype(np.float32)}
    with MemoryEngine(_config(tmp_path / "ties.db"), embedder=TableEmbedder(table)) as eng:
        eng.import_memories([{"content": text} for text in table if text not in ("q", "near")], session_id="s")
        for query in ("q", "near"):
            _same(eng.candidate_search.dense(query, "s", [], 12), _oracle(eng, query, "s", [], 12))


def test_quantized_session_follows_writes(tmp_path):
    with MemoryEngine(_config(tmp_path / "m.db", vector_cache_max=10), embedder=SpreadEmbedder()) as eng:
        ids = eng.save([f"memory number {i}" for i in range(30)], session_id="s")["ids"]
        assert eng.candidate_search.dense("memory number 7", "s", [], 1)[0][0] == ids[7]
        assert eng.index.quantized_size == 30
        new = eng.save(["a brand new memory"], session_id="s")["ids"][0]
        assert eng.index.quantized_size == 31 and eng.candidate_search.dense("a brand new memory", "s", [], 1)[0][0] == new
        eng.update(ids[3], "rewritten completely")
        assert eng.candidate_search.dense("rewritten completely", "s", [], 1)[0][0] == ids[3]
        eng.delete(ids[7])
        assert ids[7] not in [m for m, _ in eng.candidate_search.dense("memory number 7", "s", [], 31)]
        eng.save(["Memory number 9"], session_id="s")
        assert eng.index.quantized_size == 31
        texts = ["memory number 12", "something else entirely"]
        with eng.index.write():  # the near-duplicate check on the quantised copy
            nearest = eng.index.nearest("s", eng.embedder.embed_documents(texts))
        for (mid, score), text in zip(nearest, texts):
            best = _oracle(eng, text, "s", [], 1)[0]
            assert mid == best[0] and abs(score - best[1]) < 0.02


class TableEmbedder(HashEmbedder):
    """Texts embedded as the vectors given for them."""

    def __init__(self, table: dict[str, np.ndarray]):
        super().__init__(len(next(iter(table.values()))), model="table")
        self.table = table

    def _one(self, text: str) -> np.ndarray:
        return self.table[text]


def test_quantized_top_10_decided_by_exact_cosines(tmp_path, monkeypatch):
    """Int8 cosines err by ~1e-3: rows whose exact cosines are closer than that can swap across the 10th
    place. The rows near it are rescored from their stored float vectors, so the top 10 is exact search's."""
    rng = np.random.default_rng(3)
    query = rng.standard_normal(48)
    query /= np.linalg.norm(query)
    table = {"query": query.astype(np.float32)}
    for i in range(100):  # 40 near-ties 1e-4 apart at cosine ~0.9, then 60 unrelated rows
        other = rng.standard_normal(48)
        other -= (other @ query) * query
        cosine = 0.9 - 1e-4 * i if i < 40 else rng.uniform(-0.3, 0.3)
        table[f"memory {i}"] = (cosine * query + np.sqrt(1 - cosine**2) * other / np.linalg.norm(other)).astype(np.float32)
    with MemoryEngine(_config(tmp_path / "m.db", vector_cache_max=10, dedup_mode="off"), embedder=TableEmbedder(table)) as eng:
        eng.save([t for t in table if t != "query"], session_id="s")
        want = _oracle(eng, "query", "s", [], 10)
        got = eng.candidate_search.dense("query", "s", [], 10)
        assert eng.index.quantized_size == 100
        _same(got, want)
        monkeypatch.setattr(vector_index, "BORDER", 0.0)  # int8 scores alone: they get this top 10 wrong
        assert {i for i, _ in eng.candidate_search.dense("query", "s", [], 10)} != {i for i, _ in want}


def _table_at(cosines: list[float], seed: int) -> dict[str, np.ndarray]:
    """A query and one memory per cosine to it (unit rows, 48 dimensions)."""
    rng = np.random.default_rng(seed)
    query = rng.standard_normal(48)
    query /= np.linalg.norm(query)
    table = {"query": query.astype(np.float32)}
    for i, cosine in enumerate(cosines):
        other = rng.standard_normal(48)
        other -= (other @ query) * query
        table[f"memory {i}"] = (cosine * query + np.sqrt(1 - cosine**2) * other / np.linalg.norm(other)).astype(np.float32)
    return table


def test_quantized_border_reads_only_rows_that_can_cross(tmp_path, monkeypatch):
    """Only rows int8 errors could move across the 10th place are read from vec0: none when the 10th and 11th are
    further apart than BORDER, and not the rows well above the 11th; the top 10 is exact search's either way."""
    read: list[int] = []
    blobs = vector_index.vector_blobs
    monkeypatch.setattr(vector_index, "vector_blobs", lambda conn, ids: read.extend(ids) or blobs(conn, ids))
    rng = np.random.default_rng(5)
    unrelated = list(rng.uniform(-0.3, 0.3, 60))
    gap = [0.9 - 2e-4 * i for i in range(10)] + [0.8 - 1e-4 * i for i in range(30)]  # the 11th 0.1 below the 10th
    tied = [0.95 - 1e-2 * i for i in range(5)] + [0.8 - 1e-4 * i for i in range(35)]  # 5 well above, then near-ties
    for name, cosines, expect_read in (("gap", gap, set()), ("tied", tied, None)):
        table = _table_at(cosines + unrelated, 11)
        with MemoryEngine(_config(tmp_path / f"{name}.db", vector_cache_max=10, dedup_mode="off"), embedder=TableEmbedder(table)) as eng:
            ids = eng.save([t for t in table if t != "query"], session_id="s")["ids"]
            want = _oracle(eng, "query", "s", [], 10)
            read.clear()
            got = eng.candidate_search.dense("query", "s", [], 10)
            assert eng.index.quantized_size == 100 and {i for i, _ in got} == {i for i, _ in want}
            if expect_read is not None:
                assert set(read) == expect_read
            else:  # the near-ties around the 10th are read, the 5 rows far above are not
                assert not set(read) & set(ids[:5]) and set(ids[9:11]) <= set(read)
                _same(got[5:], want[5:])


@pytest.mark.parametrize("cache_max", [500_000, 100, 0])
def test_vectors_by_id_are_the_stored_ones(filled, cache_max):
    """The re-rankers' look-up: the stored unit vectors of the ids asked for, from the float copy, a
    quantised session (read from sqlite-vec) or no copy at all; unknown ids are absent. After an
    update the copy gives the new vector."""
    with MemoryEngine(_config(filled, vector_cache_max=cache_max), embedder=SpreadEmbedder()) as eng:
        eng.candidate_search.dense("warm", "a", [], 10)  # loads session a (float or quantised)
        stored = {mid: np.frombuffer(blob, np.float32) for mid, blob in eng.store.read("SELECT memory_id, embedding FROM memory_vectors")}
        wanted = [min(stored), max(stored), sorted(stored)[200], 10**9]
        got = eng.candidate_search.vectors(wanted)
        assert sorted(got) == sorted(wanted[:3])
        for mid, vector in got.items():
            assert np.allclose(vector, stored[mid] / np.linalg.norm(stored[mid]), atol=1e-6)
    if cache_max:
        return
    with MemoryEngine(_config(filled.parent / "edit.db"), embedder=SpreadEmbedder()) as eng:
        ids = eng.save(["first text", "second text"], session_id="a")["ids"]
        eng.candidate_search.dense("warm", "a", [], 10)
        eng.update(ids[0], "a different text")
        vector = SpreadEmbedder().embed_documents(["a different text"])[0]
        assert np.allclose(eng.candidate_search.vectors([ids[0]])[ids[0]], vector / np.linalg.norm(vector), atol=1e-6)


@pytest.mark.parametrize("dimensions", [384, 40, 1000])  # bits 48 -> 64 bytes, 5 -> 8, 125 (no faster size: as they are)
def test_hamming_stage_keeps_the_nearest_rows(dimensions):
    """The first stage keeps rows at the smallest Hamming distances from the query's bits (the padding
    adds no distance), only rows the mask allows."""
    rng = np.random.default_rng(7)
    centre = np.zeros(dimensions, np.float32)
    rows = rng.standard_normal((3000, dimensions)).astype(np.float32)
    bits = codes.sign_bits(rows, centre)
    block = vector_index._QuantBlock(centre=centre)
    block.append_bits(np.arange(1000, dtype=np.int64), bits[:1000])
    block.append_bits(np.arange(1000, 3000, dtype=np.int64), bits[1000:])  # grown in place
    for query, mask in ((rows[5] + 0.5 * rng.standard_normal(dimensions), None),
                        (rng.standard_normal(dimensions), rng.random(3000) < 0.3)):
        distance = np.unpackbits(bits ^ codes.sign_bits(query[None, :], centre), axis=1).sum(axis=1)
        allowed = np.ones(3000, bool) if mask is None else mask
        found = block.nearest_bits(query.astype(np.float32), 200, mask)
        assert len(set(found.tolist())) == 200 and allowed[found].all()
        assert sorted(distance[found]) == sorted(distance[allowed])[:200]


def test_hamming_depth_grows_with_the_rows_searched(monkeypatch):
    """With the 4-bit codes held, the Hamming stage keeps at least one candidate per RESCORE_ROWS rows searched (the
    rows a filter allows), so a larger session keeps its recall; without them (int8 codes read per candidate) it keeps
    RESCORE_MIN. The rows kept are still the nearest by Hamming distance."""
    monkeypatch.setattr(vector_index, "RESCORE_MIN", 50)
    monkeypatch.setattr(vector_index, "RESCORE_ROWS", 10)
    rng = np.random.default_rng(9)
    centre = np.zeros(48, np.float32)
    rows = codes.unit(rng.standard_normal((3000, 48)))
    depths: list[int] = []
    scan = vector_index._QuantBlock.nearest_bits
    monkeypatch.setattr(vector_index._QuantBlock, "nearest_bits", lambda self, q, depth, mask: depths.append(depth) or scan(self, q, depth, mask))
    held = vector_index._QuantBlock(centre=centre, with_codes=True)
    held.append_bits(np.arange(3000, dtype=np.int64), codes.sign_bits(rows, centre), codes.int8_codes(rows, centre))
    bare = vector_index._QuantBlock(centre=centre)
    bare.append_bits(np.arange(3000, dtype=np.int64), codes.sign_bits(rows, centre))
    query = codes.unit(rows[7] + 0.3 * rng.standard_normal(48))
    mask = rng.random(3000) < 0.5
    held.candidates(query, 3, None)
    held.candidates(query, 3, mask)
    bare.candidates(query, 3, None)
    assert depths == [300, int(mask.sum()) // 10, 50]
    distance = np.unpackbits(held._bits[: held.n, :6] ^ codes.sign_bits(query[None, :], centre), axis=1).sum(axis=1)
    assert sorted(distance[held.nearest_bits(query, 300, None)]) == sorted(distance)[:300]


def test_quantized_scan_leaves_the_store_lock_free(tmp_path, monkeypatch):
    """The Hamming scan of a quantised session runs outside the store lock (the BM25 search beside it takes
    the lock for its stamp): while a scan is held up, the lock is free, and a save commits but applies its
    edit to the copy only once the scan is done, so the scan sees one state of the rows."""
    with MemoryEngine(_config(tmp_path / "m.db", vector_cache_max=10), embedder=SpreadEmbedder()) as eng:
        ids = eng.save([f"memory number {i}" for i in range(30)], session_id="s")["ids"]
        eng.candidate_search.dense("warm", "s", [], 5)
        assert eng.index.quantized_size == 30
        scanning, release = threading.Event(), threading.Event()
        scan = vector_index._QuantBlock.nearest_bits

        def held_up(self, *args):
            scanning.set()
            assert release.wait(10)
            return scan(self, *args)

        monkeypatch.setattr(vector_index._QuantBlock, "nearest_bits", held_up)
        found = []
        searcher = threading.Thread(target=lambda: found.append(eng.candidate_search.dense("memory number 7", "s", [], 31)))
        searcher.start()
        assert scanning.wait(10)
        stamped = threading.Thread(target=eng.store.stamp)
        stamped.start()
        stamped.join(5)
        assert not stamped.is_alive()  # the store lock was free during the scan
        monkeypatch.setattr(vector_index._QuantBlock, "nearest_bits", scan)
        saver = threading.Thread(target=lambda: eng.save(["a brand new memory"], session_id="s"))
        saver.start()
        saver.join(0.5)
        assert saver.is_alive() and eng.index.quantized_size == 30  # committed, its edit waits for the scan
        release.set()
        searcher.join(10)
        saver.join(10)
        assert not saver.is_alive() and eng.index.quantized_size == 31
        assert found[0][0][0] == ids[7] and sorted(i for i, _ in found[0]) == sorted(ids)


def test_quantized_search_beside_writes_returns_stored_rows(tmp_path):
    """Searches of a quantised session on one thread while another saves and deletes: every list holds
    distinct ids of memories that were stored, best first."""
    with MemoryEngine(_config(tmp_path / "m.db", vector_cache_max=10, dedup_mode="off"), embedder=SpreadEmbedder()) as eng:
        ids = eng.save([f"memory number {i}" for i in range(60)], session_id="s")["ids"]
        eng.candidate_search.dense("warm", "s", [], 5)
        ever = set(ids)
        done = threading.Event()

        def write():
            for i in range(40):
                new = eng.save([f"later memory {i}"], session_id="s")["ids"]
                ever.update(new)
                eng.delete(new[0] if i % 2 else ids[i])
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        searches, seen = 0, set()
        while not done.is_set() or searches < 20:
            hits = eng.candidate_search.dense(f"memory number {searches % 60}", "s", [], 20)
            assert len({i for i, _ in hits}) == len(hits)
            assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
            seen.update(i for i, _ in hits)
            searches += 1
        writer.join()
        assert seen <= ever  # checked after the writer: a search may return a save before its ids reach `ever`
        assert eng.index.quantized_size == 60 + 40 - 40


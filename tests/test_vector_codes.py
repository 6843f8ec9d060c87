"""The two-stage dense search (sign bits, then int8 rescoring; tinycontext/codes.py, vector_index.py)
against exact float search, on real MiniLM vectors, and the codes following every write."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.memory import codes
from tinycontext.memory.schema import SCHEMA_VERSION
from tinycontext.memory.store import Store

N_SENTENCES = 120


@pytest.fixture(scope="module")
def corpus(shared_dir, real_embedder):
    """3,000 memories: pairs of real SciFact sentences with the normalised sum of their real vectors
    (as scripts/bench_scale.py builds its scale points), and 40 real queries."""
    sentences, queries = [], []
    with open(shared_dir / "datasets" / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            sentences += [s.strip() for s in json.loads(line)["text"].split(". ") if 60 <= len(s) <= 250]
            if len(sentences) >= N_SENTENCES:
                break
    with open(shared_dir / "datasets" / "scifact" / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for _, line in zip(range(40), f)]
    vectors = real_embedder.embed_documents(sentences[:N_SENTENCES])
    rng = np.random.default_rng(3)
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, N_SENTENCES, (3000, 2)) if a < b]
    pairs = sorted(set(pairs))
    sums = vectors[[a for a, _ in pairs]] + vectors[[b for _, b in pairs]]
    memories = [{"content": f"{sentences[a]} {sentences[b]}", "tags": ["even" if i % 2 == 0 else "odd"],
                 "vector": (v / np.linalg.norm(v)).astype("<f4").tobytes()} for i, ((a, b), v) in enumerate(zip(pairs, sums))]
    return memories, queries


def _engine(path, embedder, **extra) -> MemoryEngine:
    return MemoryEngine(TinyContextConfig(memory_db_path=path, models_dir=path.parent / "models", dedup_mode="off", **extra),
                        embedder=embedder)


def _exact(eng: MemoryEngine, query: str, k: int, tag: str | None = None) -> list[int]:
    rows = eng.store.read("SELECT v.memory_id, v.embedding FROM memory_vectors v JOIN memories m ON m.id = v.memory_id "
                          "WHERE (? IS NULL OR m.tags LIKE '%\"' || ? || '\"%')", (tag, tag))
    ids = np.array([r[0] for r in rows])
    matrix = codes.unit(np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1))
    scores = matrix @ codes.unit(eng.embedder.embed_query(query))
    return ids[np.argsort(-scores, kind="stable")[:k]].tolist()


# The rescoring reads every candidate's int8 codes from the database (0), or ranks them by the 4-bit copy held in RAM first.
CODES_MAX = pytest.mark.parametrize("codes_max", [0, 1_000_000], ids=["codes-on-disk", "codes-in-ram"])


@CODES_MAX
def test_two_stage_recall_at_10_matches_exact_search(tmp_path, corpus, real_embedder, codes_max):
    memories, queries = corpus
    with _engine(tmp_path / "m.db", real_embedder, vector_cache_max=500, vector_codes_max=codes_max) as eng:
        for start in range(0, len(memories), 1000):
            assert eng.import_memories(memories[start:start + 1000], session_id="s")["embedded"] == 0
        got = [[i for i, _ in eng.candidate_search.dense(q, "s", [], 10)] for q in queries]
        assert eng.index.quantized_size == len(memories) and eng.index.size == 0  # the two-stage path ran
        recall = np.mean([len(set(g) & set(_exact(eng, q, 10))) / 10 for g, q in zip(got, queries)])
        assert recall >= 0.99
        # Filters are applied inside the scan: every hit passes, and they are the filtered exact top 10.
        filtered = [[i for i, _ in eng.candidate_search.dense(q, "s", ["odd"], 10)] for q in queries[:10]]
        odd = {r[0] for r in eng.store.read("SELECT id FROM memories WHERE tags LIKE '%odd%'")}
        assert all(set(f) <= odd for f in filtered)
        assert np.mean([len(set(f) & set(_exact(eng, q, 10, "odd"))) / 10 for f, q in zip(filtered, queries)]) >= 0.99


@CODES_MAX
def test_codes_follow_every_write(tmp_path, corpus, real_embedder, codes_max):
    memories, _ = corpus
    with _engine(tmp_path / "m.db", real_embedder, vector_cache_max=50, vector_codes_max=codes_max) as eng:
        ids = eng.import_memories(memories[:200], session_id="s")["ids"]
        eng.candidate_search.dense("warm the two-stage copy", "s", [], 1)  # loaded: the writes below edit it in place
        ids += eng.save(["The committee moved the hearing to Tuesday."], session_id="s")["ids"]
        assert eng.index.quantized_size == len(ids)

        def coded() -> set[int]:
            bits = {r[0] for r in eng.store.read("SELECT memory_id FROM memory_bits WHERE session_id = 's'")}
            assert bits == {r[0] for r in eng.store.read("SELECT memory_id FROM memory_codes")}
            return bits

        assert coded() == set(ids)
        eng.delete(ids[0])
        assert ids[0] not in coded()
        assert ids[0] not in [i for i, _ in eng.candidate_search.dense(memories[0]["content"], "s", [], 5)]
        eng.update(ids[5], "A completely different memory about sea turtles nesting on beaches.")
        assert eng.candidate_search.dense("sea turtles nesting on beaches", "s", [], 1)[0][0] == ids[5]
        assert eng.index.quantized_size == len(ids) - 1  # the copy was edited in place, not reloaded
        # The packed codes of the updated memory are its new vector's.
        stored = np.frombuffer(eng.store.read("SELECT embedding FROM memory_vectors WHERE memory_id = ?", (ids[5],))[0][0], np.float32)
        packed = np.frombuffer(eng.store.read("SELECT codes FROM memory_codes WHERE memory_id = ?", (ids[5],))[0][0], np.uint8)
        centre = codes.centre(eng.store.conn)
        assert abs(codes.scores(packed[None, :], codes.unit(stored), centre)[0] - 1.0) < 2e-3


def test_4_bit_codes_rank_within_their_error(corpus):
    """The 4-bit copy held in RAM (codes.nibbles of the int8 codes) scores within a few thousandths of the
    exact cosine (a few hundredths at worst), so the int8 rescoring of its best 200 keeps the top."""
    memories, _ = corpus
    rows = codes.unit(np.stack([np.frombuffer(m["vector"], np.float32) for m in memories]))
    centre = rows[:50].mean(axis=0)
    query = rows[7] + 0.5 * rows[11]
    query /= np.linalg.norm(query)
    packed = codes.int8_codes(rows, centre)
    coarse = codes.nibble_scores(codes.nibbles(packed), query, centre)
    assert codes.nibbles(packed).shape == (len(rows), rows.shape[1] // 2 + 4)
    error = np.abs(coarse - rows @ query)
    assert error.mean() < 1e-2 and error.max() < 6e-2
    best = set(np.argsort(-(rows @ query))[:10].tolist())
    assert best <= set(np.argsort(-coarse)[:200].tolist())


def test_migration_to_v7_codes_the_stored_vectors(tmp_path, corpus, real_embedder):
    memories, _ = corpus
    path = tmp_path / "old.db"
    with _engine(path, real_embedder) as eng:
        ids = eng.import_memories(memories[:100], session_id="s")["ids"]
    raw = Store(path)  # back to v6 as it was: no code tables
    with raw.write() as conn:
        for statement in ("DROP TRIGGER memories_codes_ad", "DROP TABLE memory_bits", "DROP TABLE memory_codes",
                          "DELETE FROM meta WHERE key = 'vector_centre'", "PRAGMA user_version = 6"):
            conn.execute(statement)
    raw.close()
    with _engine(path, real_embedder, vector_cache_max=10) as eng:
        assert eng.store.schema_version == SCHEMA_VERSION  # v7 and every later migration ran
        assert {r[0] for r in eng.store.read("SELECT memory_id FROM memory_codes")} == set(ids)
        assert eng.candidate_search.dense(memories[7]["content"], "s", [], 1)[0][0] == ids[7]

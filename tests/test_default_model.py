"""The default model: minilm-l6-tuned3 for new databases, while a database built with an earlier default (the int8
built-in, minilm-l6-tuned or minilm-l6-tuned2) keeps loading that model under default settings. Real models, real databases, every path that opens one."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.cli.commands import main
from tinycontext.cli.doctor import run_checks
from tinycontext.errors import ModelMismatchError
from tinycontext.memory.recall import score_cliff
from tinycontext.memory.transfer import export_jsonl, import_jsonl
from tinycontext.models.embedder import Embedder
from tinycontext.models.hub import BUILTIN_NAME, DERIVED, builtin_bundle, resolve_model
from tinycontext.retrieval.fusion import gap_cut
from tinycontext.web.scrape import embedder_for, shared_embedder

TUNED = "minilm-l6-tuned3"
# The defaults between the int8 built-in and TUNED, and the score cliff each ends answers of turns at (tuned: the default)
EARLIER_TUNED = {"minilm-l6-tuned": 0.25, "minilm-l6-tuned2": 0.28}
MEMORIES = ["I adopted a puppy named Rex last spring", "The quarterly budget review moved to Thursday",
            "My sister moved to Lisbon for a job at a bank"]
QUESTION = "what kind of dog do I have"


def settings(tmp_path, db: str = "memory.db", **fields) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / db, models_dir=tmp_path / "models", **fields)


def vectors(engine: MemoryEngine) -> dict[str, np.ndarray]:
    """Each memory's stored vector, by content."""
    return {m["content"]: np.frombuffer(m["vector"], np.float32) for m in engine.store.dump_memories(vectors=True)}


def top(engine: MemoryEngine, query: str = QUESTION) -> str:
    return engine.recall(query, dense_weight=1.0, top_k=1)["memories"][0]["content"]


@pytest.fixture
def int8_store(tmp_path):
    """A database as the previous default made it: the int8 built-in, named explicitly here (the same model and
    identity the fast tier gave before minilm-l6-tuned)."""
    with MemoryEngine(settings(tmp_path, embedding_model=BUILTIN_NAME)) as engine:
        engine.save(MEMORIES)
        assert engine.stats()["embedder"]["model"] == BUILTIN_NAME
    return tmp_path


def test_a_new_database_gets_the_tuned_model(tmp_path):
    with MemoryEngine(settings(tmp_path)) as engine:
        engine.save(MEMORIES)
        assert engine.stats()["embedder"]["model"] == TUNED and engine.stats()["embedder"]["sha256"] == DERIVED[TUNED].sha256
        assert top(engine) == MEMORIES[0]
        tuned = Embedder(resolve_model(TUNED, tmp_path / "models"), cache_size=0)
        np.testing.assert_allclose(vectors(engine)[MEMORIES[1]], tuned.embed_documents([MEMORIES[1]])[0], atol=1e-6)


def test_an_int8_database_keeps_int8_under_default_settings(int8_store):
    builtin = Embedder(builtin_bundle(), cache_size=0)
    with MemoryEngine(settings(int8_store)) as engine:
        before = vectors(engine)
        assert engine.reindexed == 0 and engine.embedder.identity["model"] == BUILTIN_NAME
        assert top(engine) == MEMORIES[0]
        engine.save(["We keep the spare house key under the blue flowerpot"])
        assert top(engine, "where is the spare key hidden") == "We keep the spare house key under the blue flowerpot"
        after = vectors(engine)
        assert engine.stats()["embedder"]["model"] == BUILTIN_NAME
    assert all(np.array_equal(after[text], before[text]) for text in MEMORIES)  # nothing re-embedded
    new = "We keep the spare house key under the blue flowerpot"
    np.testing.assert_allclose(after[new], builtin.embed_documents([new])[0], atol=1e-6)  # new memories: int8 vectors
    assert not (int8_store / "models").exists()  # the tuned model was never needed, so never made


def test_an_emptied_int8_database_moves_to_the_tuned_model(int8_store):
    with MemoryEngine(settings(int8_store)) as engine:
        for memory in list(engine.store.dump_memories()):
            engine.delete(memory["id"])
    with MemoryEngine(settings(int8_store)) as engine:
        engine.save(MEMORIES[:1])
        assert engine.stats()["embedder"]["model"] == TUNED


@pytest.mark.parametrize("earlier", sorted(EARLIER_TUNED))
def test_a_database_of_an_earlier_tuned_model_keeps_it_and_its_cliff(tmp_path, earlier):
    """A database built while the fast tier meant an earlier tuned model keeps that model, its fusion weights, its score
    gap and its score cliff for turns (minilm-l6-tuned states none: the default); a new one gets TUNED, whose answers of
    conversation turns end at the cliff TUNED states for them (other memories' at the default), unless recall_score_cliff
    is set."""
    with MemoryEngine(settings(tmp_path, "first.db", embedding_model=earlier)) as engine:
        engine.save(MEMORIES)
        first_weights = engine.embedder.fusion_weights
    with MemoryEngine(settings(tmp_path, "first.db")) as engine:
        assert engine.embedder.identity["model"] == earlier and engine.reindexed == 0 and top(engine) == MEMORIES[0]
        assert engine.embedder.fusion_weights == first_weights and score_cliff(engine, turns=True) == EARLIER_TUNED[earlier]
        assert engine.embedder.turn_score_gap == 4.5  # its answers of turns the learned fusion ranked: the gap (session 25)
    with MemoryEngine(settings(tmp_path, "new.db")) as engine:
        engine.save(MEMORIES)
        assert engine.embedder.identity["model"] == TUNED and engine.embedder.fusion_weights != first_weights
        assert score_cliff(engine, turns=True) == engine.embedder.turn_score_cliff == 0.28
        assert score_cliff(engine, turns=False) == 0.25
        assert engine.embedder.turn_score_gap == 4.5  # and where its answers of turns the learned fusion ranked end
    with MemoryEngine(settings(tmp_path, "new.db", recall_score_cliff=0.25)) as engine:
        assert score_cliff(engine, turns=True) == 0.25  # a set value wins, even the default's


def test_recall_ends_an_answer_of_turns_at_the_models_cliff(tmp_path):
    """The model's cliff for turns is what recall reads for a conversation's turns, and only for them (real model; a
    model that states no score gap, which would end these answers instead: the next test)."""
    turns = [{"content": text, "speaker": "Ann", "occurred_at": "2024-05-01T10:00:00Z"} for text in MEMORIES]
    with MemoryEngine(settings(tmp_path)) as engine:
        engine.embedder.turn_score_gap = None
        engine.save(turns, session_id="chat", episode="e1")
        engine.save([f"Note: {text}" for text in MEMORIES], session_id="notes")
        ends = {session: len(engine.recall(QUESTION, session_id=session, min_dense=0.0)["memories"]) for session in ("chat", "notes")}
        assert ends == {"chat": 1, "notes": 1}  # the two unrelated memories are clearly weaker at 0.28 and at 0.25
        engine.embedder.turn_score_cliff = 0.99  # nothing is below 0.01 x the best: turns' answers keep all three
        assert len(engine.recall(QUESTION, session_id="chat", min_dense=0.0)["memories"]) == len(MEMORIES)
        assert len(engine.recall(QUESTION, session_id="notes", min_dense=0.0)["memories"]) == 1  # not turns: the default
        assert len(engine.recall(QUESTION, session_id="chat", min_dense=0.0, score_cliff=0.25)["memories"]) == 1  # given wins


def test_a_model_that_states_a_score_gap_ends_answers_of_turns_by_their_learned_scores(tmp_path):
    """A model's turn_score_gap ends an answer of turns the learned fusion ranked after the last turn whose learned score
    is within the gap of the best (real model, real learned scores); a cliff given or set, the rrf fusion and memories
    that are not turns keep the cliff."""
    chat = MEMORIES + ["Rex is a beagle and he loves the park", "My dog chews every shoe in the house", "I had pasta for dinner"]
    with MemoryEngine(settings(tmp_path)) as engine:
        engine.save([{"content": text, "speaker": "Ann", "occurred_at": "2024-05-01T10:00:00Z"} for text in chat], session_id="chat", episode="e1")
        engine.save([f"Note: {text}" for text in chat], session_id="notes")
        full = engine.recall(QUESTION, session_id="chat", min_dense=0.0, score_cliff=0.0)
        learned = [m["scores"]["rrf"] for m in full["memories"]]  # exp(score - best), best first
        assert len(learned) == len(chat) and learned[0] == 1.0
        # a gap between two neighbours' scores, where the drop is largest: the answer ends right there
        k = max(range(1, len(learned)), key=lambda i: learned[i - 1] / learned[i])
        gap = -math.log(math.sqrt(learned[k - 1] * learned[k]))
        engine.embedder.turn_score_gap = gap
        answer = engine.recall(QUESTION, session_id="chat", min_dense=0.0)
        assert len(answer["memories"]) == k == gap_cut(learned, gap) and answer["below_cliff"] == len(chat) - k
        assert [m["id"] for m in answer["memories"]] == [m["id"] for m in full["memories"][:k]]
        engine.embedder.turn_score_gap = 50.0  # every turn's score is within it
        assert len(engine.recall(QUESTION, session_id="chat", min_dense=0.0)["memories"]) == len(chat)

        def ends(gap, **given):
            engine.embedder.turn_score_gap = gap
            return [len(engine.recall(QUESTION, session_id=s, min_dense=0.0, **given)["memories"]) for s in ("chat", "notes")]
        # a cliff given, the rrf fusion, and memories that are not turns: the gap plays no part
        for given in ({"score_cliff": 0.28}, {"fusion": "rrf"}):
            assert ends(1e-9, **given) == ends(50.0, **given) == ends(None, **given)
        assert ends(1e-9)[1] == ends(50.0)[1] == ends(None)[1] < len(chat)
        cliff = ends(None)[0]
    with MemoryEngine(settings(tmp_path, recall_score_cliff=0.28)) as engine:
        engine.embedder.turn_score_gap = 50.0
        assert len(engine.recall(QUESTION, session_id="chat", min_dense=0.0)["memories"]) == cliff < len(chat)  # a set cliff wins


def test_a_named_model_is_exactly_that_model(int8_store, tmp_path):
    with MemoryEngine(settings(int8_store, embedding_model=TUNED)) as engine, pytest.raises(ModelMismatchError) as caught:
        engine.recall(QUESTION)
    assert BUILTIN_NAME in caught.value.message and TUNED in caught.value.message and "tinycontext reindex" in caught.value.message
    with MemoryEngine(settings(tmp_path, "tuned.db")) as engine:
        engine.save(MEMORIES)
    with MemoryEngine(settings(tmp_path, "tuned.db", embedding_model=BUILTIN_NAME)) as engine, pytest.raises(ModelMismatchError):
        engine.save(["one more"])
    with MemoryEngine(settings(tmp_path, "new.db", embedding_model=BUILTIN_NAME)) as engine:
        engine.save(MEMORIES)
        assert engine.stats()["embedder"]["model"] == BUILTIN_NAME


def test_reindex_upgrades_an_int8_database(int8_store, env, capsys):  # env: default settings on int8_store's files
    assert main(["reindex", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["reindexed"] == len(MEMORIES) and result["embedder"]["model"] == TUNED
    with MemoryEngine(settings(int8_store)) as engine:
        assert engine.reindexed == 0 and engine.embedder.identity["model"] == TUNED and top(engine) == MEMORIES[0]
        tuned = Embedder(resolve_model(TUNED, int8_store / "models"), cache_size=0)
        np.testing.assert_allclose(vectors(engine)[MEMORIES[2]], tuned.embed_documents([MEMORIES[2]])[0], atol=1e-6)
        assert engine.reindex() == 0  # already the tuned model


def test_reindex_after_use_in_the_same_engine(int8_store):
    with MemoryEngine(settings(int8_store)) as engine:
        assert top(engine) == MEMORIES[0] and engine.embedder.identity["model"] == BUILTIN_NAME
        assert engine.reindex() == len(MEMORIES)
        assert engine.embedder.identity["model"] == TUNED and engine.stats()["embedder"]["model"] == TUNED
        assert top(engine) == MEMORIES[0]


def test_doctor_reports_the_model_the_database_keeps(int8_store, env, monkeypatch):
    report = run_checks()
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["ok"], by_name
    model = by_name["model"]
    assert model["details"]["name"] == BUILTIN_NAME and model["details"]["kept_for_database"] is True
    assert f"new databases get {TUNED}" in model["summary"] and "tinycontext reindex" in model["summary"]
    assert by_name["database"]["details"]["embedder"]["model"] == BUILTIN_NAME
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(int8_store / "new.db"))
    model = {c["name"]: c for c in run_checks()["checks"]}["model"]
    assert model["details"]["name"] == TUNED and model["details"]["kept_for_database"] is False


def test_web_ranking_uses_the_default_model_not_an_old_databases(int8_store, tmp_path):
    config = settings(int8_store)
    ranking = embedder_for(config)
    assert ranking.identity["model"] == TUNED
    with MemoryEngine(config) as engine:
        assert engine.embedder.identity["model"] == BUILTIN_NAME
        assert shared_embedder(engine, config) is None  # pages are ranked with the tuned model, loaded for the web
    with MemoryEngine(settings(tmp_path, "new.db")) as engine:
        assert shared_embedder(engine, engine.config) is engine.embedder  # one copy when the database has the default


def test_an_int8_export_imports_into_a_new_database_with_the_tuned_model(int8_store, tmp_path):
    out = io.StringIO()
    with MemoryEngine(settings(int8_store)) as engine:
        export_jsonl(engine, out)
    header = json.loads(out.getvalue().splitlines()[0])
    assert header["embedder"]["model"] == BUILTIN_NAME and header["vectors"]
    with MemoryEngine(settings(tmp_path, "imported.db")) as engine:
        import_jsonl(engine, io.StringIO(out.getvalue()))
        assert engine.stats()["embedder"]["model"] == TUNED and top(engine) == MEMORIES[0]
        tuned = Embedder(resolve_model(TUNED, tmp_path / "models"), cache_size=0)
        stored = vectors(engine)
        np.testing.assert_allclose(np.stack([stored[t] for t in MEMORIES]), tuned.embed_documents(MEMORIES), atol=1e-6)
    # Back into the int8 database (default settings): its own vectors are reused, nothing is re-embedded.
    with MemoryEngine(settings(int8_store)) as engine:
        before = vectors(engine)
        for memory in list(engine.store.dump_memories())[1:]:
            engine.delete(memory["id"])
        import_jsonl(engine, io.StringIO(out.getvalue()))
        assert engine.embedder.identity["model"] == BUILTIN_NAME
        assert all(np.array_equal(vectors(engine)[t], before[t]) for t in MEMORIES)

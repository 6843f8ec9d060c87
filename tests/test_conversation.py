"""Conversations: occurred_at / speaker / attachments / episodes through the public API, the v3
migration, and the recall signals of tinycontext/retrieval/conversation.py."""

from __future__ import annotations

import json
from datetime import date, datetime

import numpy as np
import pytest

from conftest import HashEmbedder
from tinycontext import InvalidInputError, MemoryEngine, ModelUnavailableError
from tinycontext.retrieval.conversation import (
    date_words,
    embedding_text,
    FUSION_FEATURES,
    FUSION_WEIGHTS,
    fusion_features,
    learned_rerank,
    mentioned_speaker,
    rerank,
)
from tinycontext.retrieval.filters import parse_occurred_at
from tinycontext.memory.engine import _content_hash
from tinycontext.retrieval.fusion import SCORE_FUSION_DENSE_SHARE, Candidate, fuse, relevance_floor, score_fusion
from tinycontext.memory.store import SCHEMA_VERSION, Store, now_iso

CHAT_1 = [
    {"content": "I adopted a puppy last week, her name is Biscuit!", "speaker": "Ana", "occurred_at": "2023-05-08T13:56"},
    {"content": "Congrats! What breed is she?", "speaker": "Ben", "occurred_at": "2023-05-08T13:57"},
    {"content": "A beagle, she loves the park.", "speaker": "Ana", "occurred_at": "2023-05-08T13:58",
     "attachments": ["a photo of a small dog on grass"]},
]
CHAT_2 = [
    {"content": "I started pottery classes on Tuesdays.", "speaker": "Ben", "occurred_at": "2023-06-20"},
    {"content": "That sounds relaxing, send me a picture of your first bowl.", "speaker": "Ana", "occurred_at": "2023-06-20"},
]


# -- input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, stored", [
    ("2023-05-08", "2023-05-08"),
    ("2023-05-08T13:56", "2023-05-08T13:56"),
    ("2023-05-08T13:56:07", "2023-05-08T13:56:07"),
    ("2023-05-08T13:56:00Z", "2023-05-08T13:56Z"),
    ("2023-05-08T13:56+02:00", "2023-05-08T13:56+02:00"),
    (date(2023, 5, 8), "2023-05-08"),
    (datetime(2023, 5, 8, 13, 56), "2023-05-08T13:56"),
    (None, None),
])
def test_occurred_at_is_normalised_iso(raw, stored):
    assert parse_occurred_at(raw, "m") == stored


@pytest.mark.parametrize("raw", ["yesterday", "2023-13-01", "", 20230508, "8 May 2023"])
def test_occurred_at_refuses_what_is_not_iso(raw):
    with pytest.raises(InvalidInputError, match="occurred_at"):
        parse_occurred_at(raw, "memories[0]")


def test_text_forms():
    assert date_words("2023-05-08T13:56") == "8 May 2023" and date_words(None) == ""
    assert embedding_text("hi", "Ana", "2023-05-08", ["a dog"]) == "[8 May 2023] Ana: hi [shares a dog]"
    assert embedding_text("plain memory") == "plain memory"


@pytest.mark.parametrize("bad", [{"speaker": ""}, {"speaker": "x" * 101}, {"attachments": "a caption"},
                                 {"attachments": [""]}, {"episode": 7}, {"occurred_at": "soon"}])
def test_bad_turn_fields_are_typed_errors_and_save_nothing(hash_engine, bad):
    with pytest.raises(InvalidInputError):
        hash_engine.save([{"content": "fine"}, {"content": "turn", **bad}])
    assert hash_engine.stats()["memories"] == 0


# -- saving and reading -------------------------------------------------------------------------------

def test_turn_fields_round_trip_and_episodes_per_call(hash_engine):
    first = hash_engine.save(CHAT_1, session_id="chat")
    second = hash_engine.save(CHAT_2, session_id="chat")
    plain = hash_engine.save(["a plain note without a speaker"], session_id="chat")
    memory = hash_engine.get(first["ids"][2])
    assert (memory["content"], memory["speaker"], memory["occurred_at"], memory["attachments"]) == (
        "A beagle, she loves the park.", "Ana", "2023-05-08T13:58", ["a photo of a small dog on grass"])
    episodes = {hash_engine.get(i)["episode"] for i in first["ids"]}
    assert len(episodes) == 1 and None not in episodes
    assert {hash_engine.get(i)["episode"] for i in second["ids"]} != episodes
    assert hash_engine.get(plain["ids"][0])["episode"] is None  # auto_episode="turns": only turns
    # The budget counts what a reader needs: speaker and attachment included.
    assert memory["tokens"] == hash_engine.tokens.count("Ana: A beagle, she loves the park. [shares a photo of a small dog on grass]")


def test_same_words_other_speaker_or_day_are_not_duplicates(hash_engine):
    saved = hash_engine.save([{"content": "Thanks!", "speaker": "Ana"}, {"content": "Thanks!", "speaker": "Ben"},
                              {"content": "Thanks!", "speaker": "Ana", "occurred_at": "2023-01-02"},
                              {"content": "Thanks!", "speaker": "Ana"}])
    assert len(saved["ids"]) == 3 and saved["skipped"] == [{"index": 3, "reason": "duplicate", "duplicate_of": saved["ids"][0]}]


def test_explicit_episode_spans_calls(hash_engine):
    a = hash_engine.save(CHAT_1[:2], session_id="chat", episode="thread-7")
    b = hash_engine.save([{**CHAT_1[2], "episode": "thread-7"}, {"content": "other thread", "episode": "x"}], session_id="chat")
    assert {hash_engine.get(i)["episode"] for i in a["ids"] + b["ids"][:1]} == {"thread-7"}
    assert hash_engine.get(b["ids"][1])["episode"] == "x"
    text = hash_engine.store.read("SELECT text FROM episodes_fts JOIN episodes e ON e.id = episodes_fts.rowid WHERE e.key = 'thread-7'")[0][0]
    assert "Biscuit" in text and "beagle" in text and "8 May 2023" in text


def test_date_words_speaker_and_captions_are_searchable(hash_engine):
    hash_engine.save(CHAT_1, session_id="chat")
    hash_engine.save(CHAT_2, session_id="chat")
    plain_ranking = {"dense_weight": 0.0, "episode_weight": 0.0, "neighbour_weight": 0.0, "score_cliff": 0.0}  # BM25 alone, every match
    by_date = hash_engine.recall("June 2023", **plain_ranking)["memories"]
    assert [m["occurred_at"] for m in by_date[:2]] == ["2023-06-20"] * 2 and len(by_date) == 5
    by_caption = hash_engine.recall("photo grass", **plain_ranking)["memories"]
    assert by_caption[0]["content"] == "A beagle, she loves the park."


def test_episode_text_follows_update_and_delete(hash_engine):
    ids = hash_engine.save(CHAT_1, session_id="chat")["ids"]
    episode_text = lambda: hash_engine.store.read("SELECT group_concat(text) FROM episodes_fts")[0][0] or ""
    updated = hash_engine.update(ids[1], "Congrats! Is she a corgi?")
    assert updated["speaker"] == "Ben" and updated["occurred_at"] == "2023-05-08T13:57"
    assert "corgi" in episode_text() and "breed" not in episode_text()
    for mid in ids:
        hash_engine.delete(mid)
    assert episode_text() == ""
    assert hash_engine.store.read("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'beagle'")[0][0] == 0


# -- recall signals ------------------------------------------------------------------------------------

def test_mentioned_speaker():
    assert mentioned_speaker("What did ana adopt?", {"Ana", "Ben"}) == "Ana"
    assert mentioned_speaker("Did Ana and Ben meet?", {"Ana", "Ben"}) is None
    assert mentioned_speaker("What about Banana?", {"Ana"}) is None


def _cands(*scores):
    return [Candidate(i, bm25_rank=i, rrf=s) for i, s in enumerate(scores, start=1)]


def test_rerank_speaker_boost_neighbours_and_episodes():
    info = {1: (10, "Ana"), 2: (10, "Ben"), 3: (20, "Ben")}
    off = dict(episode_hits=[], dense_hits=[], episode_weight=0.0, neighbour_weight=0.0)
    # Speaker: Ben's turns overtake Ana's when the query names Ben.
    assert [c.id for c in rerank(_cands(0.10, 0.09, 0.08), info, query="What did Ben say?", speaker_boost=0.5, **off)] == [2, 3, 1]
    # Neighbours: 2 follows 1 in episode 10 and gains from it; 3 is in another episode.
    ranked = rerank(_cands(0.10, 0.01, 0.02), info, query="q", speaker_boost=0.0, **{**off, "neighbour_weight": 0.3})
    assert [c.id for c in ranked] == [1, 2, 3] and ranked[1].rrf == pytest.approx(0.01 + 0.03)
    # Episodes: episode 20 ranks first by BM25 and best dense turn, so its turn overtakes.
    ranked = rerank(_cands(0.10, 0.09, 0.095), info, query="q", speaker_boost=0.0, episode_hits=[(20, 5.0), (10, 1.0)],
                    dense_hits=[(3, 0.9), (1, 0.2)], episode_weight=0.2, neighbour_weight=0.0)
    assert [c.id for c in ranked] == [3, 1, 2]


def test_neighbour_joins_only_when_expanding():
    info = {1: (10, "Ana"), 2: (10, "Ben"), 5: (20, "Ben")}
    args = dict(query="q", episode_hits=[], dense_hits=[], episode_weight=0.0, neighbour_weight=0.5, speaker_boost=0.0)
    assert [c.id for c in rerank([Candidate(1, rrf=0.1)], info, **args)] == [1]
    joined = rerank([Candidate(1, rrf=0.1)], info, expand=True, **args)
    assert [(c.id, c.rrf) for c in joined] == [(1, 0.1), (2, pytest.approx(0.05))] and joined[1].bm25_rank is None


def test_recall_adds_the_answer_after_a_question_unless_filtered(hash_engine):
    ids = hash_engine.save([{"content": "Which city did you move to?", "speaker": "Ben", "tags": ["q"]},
                            {"content": "Lisbon, last spring.", "speaker": "Ana"}], session_id="chat")["ids"]
    found = [m["id"] for m in hash_engine.recall("which city did you move to", session_id="chat", dense_weight=0.0)["memories"]]
    assert found == ids
    filtered = hash_engine.recall("which city did you move to", session_id="chat", dense_weight=0.0, tags=["q"])["memories"]
    assert [m["id"] for m in filtered] == ids[:1]


def test_plain_memories_skip_the_conversation_rerank_and_fuse_by_score(config):
    notes = ["The deploy key rotates every 90 days.", "Standup is at 09:30 in room Ada.", "Water the ficus on Sundays.",
             "The deploy runbook lives in the wiki.", "Keys for the deploy box are in the safe."]
    query = "deploy key rotation wiki"
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        eng.save(notes)
        on = eng.recall(query, fusion="rrf", score_cliff=0.0)
        off = eng.recall(query, fusion="rrf", episode_weight=0.0, neighbour_weight=0.0, speaker_boost=0.0, score_cliff=0.0)
        learned = eng.recall(query, score_cliff=0.0)
        signals = eng.search(query)
        floor = eng.default_min_dense()
    # The conversation signals leave memories that are not turns alone.
    assert [(m["id"], m["scores"]) for m in on["memories"]] == [(m["id"], m["scores"]) for m in off["memories"]]
    # "learned" ranks them by their scores relative to each list's best (fusion.score_fusion).
    bm25, dense = list(signals.bm25), list(signals.dense)
    expected = score_fusion(relevance_floor(fuse(bm25, dense, dense_weight=0.5, k=10), floor)[0], dense)
    assert [m["id"] for m in learned["memories"]] == [c.id for c in expected][:len(learned["memories"])]
    best_bm25, (best, last) = max(s for _, s in bm25), (dense[0][1], dense[-1][1])
    for m in learned["memories"]:
        s = m["scores"]
        share = (1 - SCORE_FUSION_DENSE_SHARE) * (s["bm25"] or 0.0) / best_bm25 + SCORE_FUSION_DENSE_SHARE * (
            (s["dense"] - last) / (best - last) if s["dense"] is not None else 0.0)
        assert s["rrf"] == pytest.approx(share)


def _feature(rows, name):
    return [row[FUSION_FEATURES.index(name)] for row in rows]


def test_fusion_features_read_neighbours_episodes_and_speakers():
    # Episode 10: turns 1-3; episode 20: turns 4-5. Candidates 2 and 4; 3 joins as 2's neighbour, and
    # 1 (before 2) and 5 (after 4) too.
    info = {1: (10, "Ana"), 2: (10, "Ben"), 3: (10, "Ana"), 4: (20, "Ana"), 5: (20, "Ben")}
    ranked = [Candidate(2, bm25_rank=1, bm25=4.0, dense_rank=2, dense=0.5, rrf=0.09),
              Candidate(4, bm25_rank=2, bm25=2.0, dense_rank=1, dense=0.7, rrf=0.08)]
    dense = [(4, 0.7), (2, 0.5), (9, 0.2)]
    # Unit vectors: the query is e0; turn 3 (a short answer) is orthogonal to it, turn 2 before it is e0;
    # turn 5 has no stored vector.
    e0, e1 = np.eye(2)
    vectors = {1: e1, 2: e0, 3: e1, 4: (e0 + e1) / np.sqrt(2)}
    pool, rows = fusion_features(ranked, info, query="What did Ana bake?", episode_hits=[(20, 6.0), (10, 3.0)],
                                 dense_hits=dense, query_vector=e0, vectors=vectors, expand=True)
    assert [c.id for c in pool] == [2, 4, 1, 3, 5] and all(len(row) == len(FUSION_FEATURES) == len(FUSION_WEIGHTS) for row in rows)
    assert _feature(rows, "bm25_share") == [1.0, 0.5, 0.0, 0.0, 0.0]
    assert _feature(rows, "dense_gap") == pytest.approx([-0.2, 0.0, -0.5, -0.5, -0.5])  # outside the list: the last hit's
    assert _feature(rows, "rrf") == [0.09, 0.08, 0.0, 0.0, 0.0]
    assert _feature(rows, "episode_bm25_share") == [0.5, 1.0, 0.5, 0.5, 1.0]
    assert _feature(rows, "episode_dense_gap") == pytest.approx([-0.2, 0.0, -0.2, -0.2, 0.0])
    assert _feature(rows, "prev_rrf") == [0.0, 0.0, 0.0, 0.09, 0.08]  # 4 starts episode 20: turn 3 is another episode's
    assert _feature(rows, "next_rrf") == [0.0, 0.0, 0.09, 0.0, 0.0]
    assert _feature(rows, "speaker_named") == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert _feature(rows, "other_speaker") == [1.0, 0.0, 0.0, 0.0, 1.0]
    # Window: the turn plus the one before it in its episode, renormalised; 1 starts episode 10 and 4
    # episode 20 (alone); 5 has no vector (the last hit's score); minus the best hit's 0.7.
    root = np.sqrt(0.5)
    assert _feature(rows, "window_gap") == pytest.approx([root - 0.7, root - 0.7, -0.7, root - 0.7, 0.2 - 0.7])
    # Without expand only the candidates are scored; their neighbours still inform the features.
    pool, rows = fusion_features(ranked, info, query="q", episode_hits=[], dense_hits=dense, query_vector=e0, vectors={})
    assert [c.id for c in pool] == [2, 4] and _feature(rows, "speaker_named") == [0.0, 0.0]


def test_learned_rerank_orders_by_the_weights_and_composes():
    info = {1: (10, "Ana"), 2: (10, "Ben"), 3: (20, "Ben")}
    ranked = [Candidate(1, bm25_rank=1, bm25=3.0, dense_rank=2, dense=0.4, rrf=0.1),
              Candidate(3, bm25_rank=2, bm25=1.0, dense_rank=1, dense=0.6, rrf=0.09)]
    args = dict(query="q", episode_hits=[], dense_hits=[(3, 0.6), (1, 0.4)], query_vector=np.eye(2)[0], vectors={})
    only_bm25 = [1.0 if name == "bm25_share" else 0.0 for name in FUSION_FEATURES]
    only_dense = [1.0 if name == "dense_gap" else 0.0 for name in FUSION_FEATURES]
    assert [c.id for c in learned_rerank(ranked, info, weights=only_bm25, **args)] == [1, 3]
    out = learned_rerank(ranked, info, weights=only_dense, expand=True, **args)
    assert [c.id for c in out] == [3, 1, 2]  # 2 joins after 1 (its dense gap is the last hit's, tied with 1's)
    assert out[0].rrf == 1.0 and out[0].rrf > out[1].rrf >= out[2].rrf > 0
    # Keyword-only (no dense hits): the features are undefined, the fused order stays.
    assert learned_rerank(ranked, info, query="q", episode_hits=[], dense_hits=[], query_vector=np.eye(2)[0], vectors={}) is ranked


def test_fusion_setting(hash_engine):
    ids = hash_engine.save(CHAT_1 + CHAT_2[:1], session_id="chat")["ids"]
    learned = hash_engine.recall("puppy beagle park", session_id="chat", score_cliff=0.0)
    rrf = hash_engine.recall("puppy beagle park", session_id="chat", score_cliff=0.0, fusion="rrf")
    assert sorted(m["id"] for m in learned["memories"]) == sorted(ids) == sorted(m["id"] for m in rrf["memories"])
    assert learned["memories"][0]["scores"]["rrf"] == 1.0 != rrf["memories"][0]["scores"]["rrf"]
    with pytest.raises(InvalidInputError, match="fusion"):
        hash_engine.recall("dog", fusion="boosted")


def test_a_model_that_states_its_own_fusion_weights_is_ranked_by_them(config):
    """A model's ``fusion_weights`` (model_config.json) replace FUSION_WEIGHTS: here twice FUSION_WEIGHTS, which keeps
    the order and squares every exp(score - best) the learned fusion hands on."""
    texts = CHAT_1 + CHAT_2
    query = "puppy beagle park"
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        eng.save(texts, session_id="chat")
        before = eng.recall(query, session_id="chat", score_cliff=0.0, min_dense=0.0)["memories"]
        eng.embedder.fusion_weights = tuple(2 * w for w in FUSION_WEIGHTS)
        after = eng.recall(query, session_id="chat", score_cliff=0.0, min_dense=0.0)["memories"]
        assert [m["id"] for m in after] == [m["id"] for m in before] and len(after) > 2
        assert [m["scores"]["rrf"] for m in after] == pytest.approx([m["scores"]["rrf"] ** 2 for m in before])
        assert any(m["scores"]["rrf"] < 0.99 for m in before)  # the squares differ from the values
        eng.embedder.fusion_weights = FUSION_WEIGHTS[:-1]
        with pytest.raises(ModelUnavailableError, match="11 fusion_weights"):
            eng.recall(query, session_id="chat")


def test_the_default_model_states_fusion_weights_fitted_on_its_own_signals(real_embedder, tmp_path):
    """minilm-l6-tuned3 carries weights fitted on its fold models' LoCoMo signals (notes/locomo.md, sessions 23-24, 27); the
    int8 built-in states none (FUSION_WEIGHTS were fitted on it). A bad value is refused when the bundle loads."""
    from tinycontext.models.embedder import ModelBundle
    from tinycontext.models.hub import builtin_bundle

    assert real_embedder.identity["model"] == "minilm-l6-tuned3"
    assert len(real_embedder.fusion_weights) == len(FUSION_FEATURES) and real_embedder.fusion_weights != FUSION_WEIGHTS
    assert builtin_bundle().fusion_weights is None
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "model_config.json").write_text(json.dumps({"dimensions": 384, "fusion_weights": ["heavy"]}))
    with pytest.raises(ModelUnavailableError, match="fusion_weights"):
        ModelBundle.from_folder(tmp_path)
    for gap in (0, -1.0, "wide", float("nan")):
        (tmp_path / "model_config.json").write_text(json.dumps({"dimensions": 384, "turn_score_gap": gap}))
        with pytest.raises(ModelUnavailableError, match="turn_score_gap"):
            ModelBundle.from_folder(tmp_path)
    (tmp_path / "model_config.json").write_text(json.dumps({"dimensions": 384, "turn_score_gap": 4}))
    assert ModelBundle.from_folder(tmp_path).stated["turn_score_gap"] == 4.0


def test_recall_knobs_are_checked(hash_engine):
    hash_engine.save(CHAT_1)
    for knob in ("episode_weight", "neighbour_weight", "speaker_boost"):
        with pytest.raises(InvalidInputError, match=knob):
            hash_engine.recall("dog", **{knob: -1})


def test_episode_lifts_the_answer_turn_real_model(engine):
    """The turn that answers ("a beagle") shares no word with the question; its episode does."""
    engine.save(CHAT_1, session_id="chat")
    engine.save(CHAT_2, session_id="chat")
    engine.save([{"content": "My cousin has a parrot that talks.", "speaker": "Ben", "occurred_at": "2023-07-01"},
                 {"content": "Parrots can live for decades.", "speaker": "Ana", "occurred_at": "2023-07-01"}], session_id="chat")
    question = "What breed is Ana's puppy Biscuit?"
    top = [m["content"] for m in engine.recall(question, session_id="chat", top_k=3, score_cliff=0.0)["memories"]]
    assert "A beagle, she loves the park." in top
    without = [m["content"] for m in engine.recall(question, session_id="chat", top_k=3, score_cliff=0.0, fusion="rrf",
                                                    episode_weight=0.0, neighbour_weight=0.0, speaker_boost=0.0)["memories"]]
    assert top.index("A beagle, she loves the park.") <= (without.index("A beagle, she loves the park.") if "A beagle, she loves the park." in without else 3)


# -- migration ----------------------------------------------------------------------------------------

def test_migration_v2_to_v3_keeps_everything(config):
    store = Store(config.memory_db_path, target_version=2)
    rows = [("work", "The deploy key rotates every 90 days.", ["ops"]), ("home", "Water the ficus on Sundays.", [])]
    ids = []
    with store.write() as conn:
        for session, content, tags in rows:
            stamp = now_iso()
            conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (session, stamp))
            ids.append(conn.execute(
                "INSERT INTO memories(session_id, content, tags, metadata, content_hash, tokens, created_at, updated_at, version)"
                " VALUES (?, ?, ?, '{}', ?, 5, ?, ?, 1)", (session, content, json.dumps(tags), _content_hash(content), stamp, stamp)).lastrowid)
            conn.executemany("INSERT INTO memory_tags(memory_id, tag) VALUES (?, ?)", [(ids[-1], t) for t in tags])
    store.close()
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        assert eng.store.schema_version == SCHEMA_VERSION >= 3
        for mid, (session, content, tags) in zip(ids, rows):
            m = eng.get(mid)
            assert (m["session_id"], m["content"], m["tags"], m["speaker"], m["occurred_at"], m["episode"]) == (session, content, tags, None, None, None)
        assert [m["id"] for m in eng.recall("deploy key", dense_weight=0.0)["memories"]] == [ids[0]]  # FTS rebuilt
        new = eng.save([{"content": "hello", "speaker": "Ana"}], session_id="work")["ids"][0]
        assert new > max(ids)
    # Re-running the migration changes nothing.
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        eng.store.migrate()
        assert eng.store.read("SELECT count(*) FROM memories")[0][0] == 3
        assert eng.store.read("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'ficus'")[0][0] == 1


# -- interfaces ---------------------------------------------------------------------------------------

def test_mcp_save_and_recall_a_conversation(tmp_path):
    import anyio
    from mcp.shared.memory import create_connected_server_and_client_session

    from tinycontext import TinyContextConfig, close_engines
    from tinycontext.servers.mcp_server import build_server

    server = build_server(TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models"))

    async def scenario():
        async with create_connected_server_and_client_session(server) as client:
            saved = await client.call_tool("save_memories", {"memories": CHAT_1, "session_id": "chat"})
            assert not saved.isError, saved.content[0].text
            bad = await client.call_tool("save_memories", {"memories": [{"content": "x", "occurred_at": "someday"}]})
            assert bad.isError and bad.content[0].text.startswith("invalid_input: ")
            result = await client.call_tool("recall_memories", {"query": "beagle park dog", "session_id": "chat", "top_k": 1})
            line = result.content[0].text.splitlines()[0]
            assert line.startswith("- Ana: A beagle, she loves the park. [shares a photo of a small dog on grass] (2023-05-08; id ")
            item = result.structuredContent["memories"][0]
            assert (item["speaker"], item["attachments"], item["date"]) == ("Ana", ["a photo of a small dog on grass"], "2023-05-08")
            full = await client.call_tool("recall_memories", {"query": "beagle", "session_id": "chat", "top_k": 1, "detail": "full"})
            assert full.structuredContent["memories"][0]["occurred_at"] == "2023-05-08T13:58"

    try:
        anyio.run(scenario)
    finally:
        close_engines()


def test_cli_save_turn_flags(env, capsys):
    from tinycontext.cli.commands import main

    assert main(["save", "I moved to Lisbon.", "--speaker", "Ana", "--occurred-at", "2024-03-01", "--episode", "t1",
                 "--attachment", "a photo of a tram", "--session", "chat"]) == 0
    capsys.readouterr()
    assert main(["recall", "Lisbon tram", "--session", "chat", "--json"]) == 0
    item = json.loads(capsys.readouterr().out)["memories"][0]
    assert (item["speaker"], item["date"], item["attachments"]) == ("Ana", "2024-03-01", ["a photo of a tram"])
    assert main(["get", str(item["id"]), "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)
    assert (memory["occurred_at"], memory["episode"]) == ("2024-03-01", "t1")
    assert main(["save", "x", "--occurred-at", "March"]) == 1
    assert capsys.readouterr().err.startswith("invalid_input: ")


def test_export_import_keeps_turn_fields(tmp_path):
    from tinycontext import TinyContextConfig
    from tinycontext.memory.transfer import import_jsonl, iter_export

    source = TinyContextConfig(memory_db_path=tmp_path / "a.db", models_dir=tmp_path / "models")
    target = TinyContextConfig(memory_db_path=tmp_path / "b.db", models_dir=tmp_path / "models")
    with MemoryEngine(source, embedder=HashEmbedder()) as a:
        ids = a.save(CHAT_1, session_id="chat")["ids"] + a.save(["plain note"], session_id="chat")["ids"]
        lines = [json.dumps(r) for r in iter_export(a)]
        before = [a.get(i, history=False) for i in ids]
    for _ in range(2):  # the second import changes nothing
        with MemoryEngine(target, embedder=HashEmbedder()) as b:
            import_jsonl(b, lines)
            after = [b.get(i, history=False) for i in ids]
            assert after == before
            assert b.store.read("SELECT count(*) FROM memories")[0][0] == 4
            assert b.store.read("SELECT count(*) FROM episodes_fts WHERE episodes_fts MATCH 'beagle'")[0][0] == 1
            assert [m["id"] for m in b.recall("photo grass", dense_weight=0.0, top_k=1)["memories"]] == [ids[2]]

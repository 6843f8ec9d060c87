"""Postings scored with numpy (tinycontext/retrieval/postings.py, work in progress): the bounded BM25 computed from
a postings table built out of FTS5's index gives FTS5's list exactly, ids and floats, on real text."""

from __future__ import annotations

import json
import re

from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.memory.candidates import BM25_WEIGHTS
from tinycontext.retrieval.bounded_bm25 import bounded_match
from tinycontext.retrieval.postings import Postings, build


def _words(expression: str) -> list[str]:
    return re.findall(r'"([^"]*)"', expression)


def test_numpy_scores_are_fts5s(tmp_path, shared_dir):
    data = json.loads((shared_dir / "datasets" / "locomo" / "locomo-dev.json").read_text(encoding="utf-8"))
    conv = data[0]["conversation"]
    turns = [f"{t['speaker']}: {t['text']}" for k in sorted((k for k in conv if re.fullmatch(r"session_\d+", k)),
                                                           key=lambda k: int(k.split("_")[1])) for t in conv[k]]
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", recall_fts_budget=60)
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        engine.save([{"content": t, "tags": ["chat"] if i % 3 else []} for i, t in enumerate(turns)], session_id="s")
        with engine.store.write() as conn:
            assert build(conn, BM25_WEIGHTS) > 100
        postings = Postings(engine.store, "porter unicode61 remove_diacritics 2")
        checked = 0
        for question in [q["question"] for q in data[0]["qa"]][:60]:
            kept, aside = bounded_match(engine.store, question, 60)
            if aside is None:
                continue
            for depth in (10, 100):
                got = postings.bounded_scores(_words(kept), _words(aside), depth)
                if got is not None:
                    assert got == engine.candidate_search.bm25(question, "s", [], depth)
                    checked += 1
        assert checked > 40

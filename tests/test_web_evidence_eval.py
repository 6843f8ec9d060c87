"""The web-evidence experiment (scripts/web_evidence.py) on a few questions: pages build, extraction keeps every evidence
unit of the whole page, budgets hold, and more budget never loses evidence on average."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from conftest import HashEmbedder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from web_evidence import (REAL_PAGES, PageServer, bm25_paragraphs, evaluate, evidence_recall, locomo_site, passage_share,
                          real_site, scifact_site, summarise)
from tinycontext import TinyContextConfig
from tinycontext.budget.tokens import TokenCounter


def test_evidence_recall_ignores_markup_and_case():
    assert evidence_recall(["Caroline: I went to a LGBTQ support group yesterday!"],
                           "**Caroline**: I went to a LGBTQ support group   yesterday!") == 1.0
    assert evidence_recall(["a b c", "d e f"], "x a b c y") == 0.5


@pytest.mark.slow
def test_locomo_and_scifact_pages_through_the_real_fetch_path(shared_dir, tmp_path):
    sites = [locomo_site(shared_dir / "datasets/locomo/locomo-dev.json", [1, 2, 3, 4], stride=150),
             scifact_site(shared_dir / "datasets/scifact", abstracts_per_page=6, limit=3, seed=0)]
    assert len(sites[0].pages) == 5 and len(sites[1].pages) == 3
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True)
    rows = []
    with PageServer({p: b for s in sites for p, b in s.pages.items()}) as server:
        for site in sites:
            rows.extend(asyncio.run(evaluate(site, server.base_url, [500, 2000], config, "page", embedder=HashEmbedder())))
    whole = [r for r in rows if r["method"] == "whole page"]
    assert whole and all(r["recall"] == 1.0 for r in whole)  # the chrome is dropped, every message is kept
    ours = [r for r in rows if r["method"] == "scrape_urls"]
    assert all(r["tokens"] <= r["budget"] and r["structured_tokens"] <= r["budget"] for r in ours)
    table = {(s["dataset"], s["method"], s["budget"]): s for s in summarise(rows)}
    for dataset in ("locomo", "scifact"):
        assert table[(dataset, "scrape_urls", 2000)]["evidence_recall"] >= table[(dataset, "scrape_urls", 500)]["evidence_recall"]
        assert table[(dataset, "whole page", "")]["tokens_vs_whole"] == 1.0


@pytest.mark.slow
def test_locomo_long_pages_lay_conversations_out_as_one_page_and_keep_every_message(shared_dir, tmp_path):
    group = ["conv-26", "conv-30"]
    path = shared_dir / "datasets/locomo/locomo-dev.json"
    site = locomo_site(path, [1, 2, 3, 4], stride=40, conversations=group, long_pages=[group])
    single = locomo_site(path, [1, 2, 3, 4], conversations=group)
    long_path = "/locomo/conv-26+conv-30.html"
    assert long_path in site.pages and len(site.pages[long_path]) > max(len(site.pages[f"/locomo/{c}.html"]) for c in group)
    asked = {q.qid.split(":")[1] for q in site.questions}
    assert asked == set(group) and {q.url_path for q in site.questions} == {long_path}
    assert len(site.questions) == len(single.questions[::40])
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True)
    with PageServer(site.pages) as server:
        rows = asyncio.run(evaluate(site, server.base_url, [500], config, "page", embedder=HashEmbedder()))
    whole = [r for r in rows if r["method"] == "whole page"]
    # Both conversations survive extraction: the second one's evidence lies past the first article.
    assert len(whole) == len(site.questions) and all(r["recall"] == 1.0 for r in whole)


def test_real_pages_gold_passages_sit_at_their_offsets_deep_in_the_page():
    import json

    questions = [json.loads(line) for line in (REAL_PAGES / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(questions) >= 60
    for q in questions:
        text = (REAL_PAGES / "pages" / f"{q['page']}.txt").read_text(encoding="utf-8")
        assert text[q["start"]:q["end"]] == q["passage"] and "\n\n" not in q["passage"]
        assert q["start"] >= 0.3 * len(text)  # not the lead
    splits = {s: {q["page"] for q in questions if q["split"] == s} for s in ("dev", "test")}
    assert splits["dev"] and splits["test"] and not splits["dev"] & splits["test"]  # split by page
    site = real_site(REAL_PAGES, "test")
    assert {q.url_path for q in site.questions} == set(site.pages) and site.scoring == "passage"


def test_a_gold_passage_counts_only_when_one_window_holds_it():
    assert passage_share("The tram costs 420 million", ["x", "the TRAM costs 420 million pounds"]) == 1.0
    assert passage_share("a b c d e", ["a b c", "d e"]) == 0.6  # cut in two windows: 60%, not 100%
    picked = bm25_paragraphs("tram cost", "Intro.\n\nThe tram will cost a lot.\n\nOther news.", 50, TokenCounter())
    assert picked == ["The tram will cost a lot."]

"""The web-evidence experiment (scripts/web_evidence.py) on a few questions: pages build, extraction keeps every evidence
unit of the whole page, budgets hold, and more budget never loses evidence on average."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from conftest import HashEmbedder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from web_evidence import PageServer, evaluate, evidence_recall, locomo_site, scifact_site, summarise
from tinycontext import TinyContextConfig


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

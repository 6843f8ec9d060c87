"""fts_query safety (checked against a real FTS5 table) and weighted reciprocal rank fusion."""

from __future__ import annotations

import math

import pytest

from tinycontext.retrieval.fusion import MAX_QUERY_TERMS, fts_query, fuse, score_fusion
from tinycontext.sqlite import sqlite_driver


@pytest.fixture(scope="module")
def fts():
    """An in-memory FTS5 table with the engine's tokenizer, to run generated MATCH expressions."""
    driver, _ = sqlite_driver()
    conn = driver.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize='porter unicode61 remove_diacritics 2')")
    docs = ["apples AND oranges", "near the river bank", "café au lait", "日本語 テキスト", "snake_case names", "plain words only"]
    conn.executemany("INSERT INTO t(content) VALUES (?)", [(d,) for d in docs])
    yield conn
    conn.close()


def match(conn, query: str) -> list[str]:
    expr = fts_query(query)
    if expr is None:
        return []
    return [r[0] for r in conn.execute("SELECT content FROM t WHERE t MATCH ? ORDER BY rowid", (expr,))]


HOSTILE = [
    'AND', 'OR NOT', 'apples AND', 'NEAR(apples oranges, 2)', 'NEAR', 'appl*', '^apples', 'content:apples',
    'what? is: this', '"unbalanced quote', "it's", '(apples', 'apples)', '((()))', '-apples', '+', '{content}: x',
    'a\x00b', 'café', 'cafe\u0301', '日本語', '🙂 emoji only 🙂', 'snake_case', '* ^ : ( ) " ?', '\\', "'; DROP TABLE t; --",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_are_valid_fts5(fts, query):
    match(fts, query)  # raises OperationalError if the expression were not valid FTS5 syntax


def test_operators_are_searched_as_words(fts):
    # "AND" is a word of the first document, not an operator here.
    assert match(fts, "AND") == ["apples AND oranges"]
    assert match(fts, "NEAR") == ["near the river bank"]
    assert match(fts, "NEAR(apples oranges, 2)") == ["apples AND oranges", "near the river bank"]


def test_terms_are_or_joined_and_quoted():
    assert fts_query("apples oranges") == '"apples" OR "oranges"'
    assert fts_query("appl* ^x col:y") == '"appl" OR "x" OR "col" OR "y"'


def test_non_ascii_terms_match(fts):
    assert match(fts, "cafe") == ["café au lait"]  # remove_diacritics
    assert match(fts, "café!") == ["café au lait"]
    assert match(fts, "日本語") == ["日本語 テキスト"]


def test_underscore_words_become_phrases(fts):
    assert fts_query("snake_case") == '"snake case"'
    assert match(fts, "snake_case") == ["snake_case names"]


def test_nul_is_a_separator():
    assert fts_query("x\x00y") == '"x" OR "y"'


@pytest.mark.parametrize("query", ["", "   ", "?!*^()", "🙂🙂", '"" ::'])
def test_no_words_gives_none(query):
    assert fts_query(query) is None


def test_terms_are_deduplicated_case_insensitively_and_capped():
    assert fts_query("Apple apple APPLE pear") == '"Apple" OR "pear"'
    many = " ".join(f"w{i}" for i in range(MAX_QUERY_TERMS * 2))
    assert fts_query(many).count(" OR ") == MAX_QUERY_TERMS - 1


# -- fusion -------------------------------------------------------------------------------------

BM25 = [(1, 9.0), (2, 5.0), (3, 1.0)]
DENSE = [(3, 0.9), (4, 0.8), (1, 0.1)]


def test_fusion_values_by_hand():
    ranked = fuse(BM25, DENSE, dense_weight=0.5, k=60)
    by_id = {c.id: c for c in ranked}
    assert math.isclose(by_id[1].rrf, 0.5 / 61 + 0.5 / 63)
    assert math.isclose(by_id[2].rrf, 0.5 / 62)
    assert math.isclose(by_id[3].rrf, 0.5 / 63 + 0.5 / 61)
    assert math.isclose(by_id[4].rrf, 0.5 / 62)
    # 1 and 3 tie on rrf; with w=0.5 ties break on the BM25 rank. 2 and 4 tie; 2 has a BM25 rank.
    assert [c.id for c in ranked] == [1, 3, 2, 4]
    assert (by_id[1].bm25_rank, by_id[1].dense_rank, by_id[1].bm25, by_id[1].dense) == (1, 3, 9.0, 0.1)
    assert (by_id[4].bm25_rank, by_id[4].bm25) == (None, None)


def test_fusion_weights_and_k_by_hand():
    ranked = fuse(BM25, DENSE, dense_weight=0.8, k=1)
    by_id = {c.id: c for c in ranked}
    assert math.isclose(by_id[3].rrf, 0.2 / 4 + 0.8 / 2)
    assert math.isclose(by_id[1].rrf, 0.2 / 2 + 0.8 / 4)
    assert math.isclose(by_id[4].rrf, 0.8 / 3)
    assert math.isclose(by_id[2].rrf, 0.2 / 3)
    assert [c.id for c in ranked] == [3, 1, 4, 2]


def test_weight_zero_is_bm25_order_and_one_is_dense_order():
    assert [c.id for c in fuse(BM25, DENSE, dense_weight=0.0, k=60)] == [1, 2, 3]
    assert [c.id for c in fuse(BM25, DENSE, dense_weight=1.0, k=60)] == [3, 4, 1]


def test_one_side_empty():
    assert [c.id for c in fuse([], DENSE, dense_weight=0.5, k=60)] == [3, 4, 1]
    assert [c.id for c in fuse(BM25, [], dense_weight=0.5, k=60)] == [1, 2, 3]
    assert fuse([], [], dense_weight=0.5, k=60) == []


def test_ties_break_toward_the_heavier_list():
    bm25, dense = [(7, 1.0), (5, 0.5)], [(5, 1.0), (7, 0.5)]
    assert [c.id for c in fuse(bm25, dense, dense_weight=0.5, k=60)] == [7, 5]
    # Reversed lists, same weights: the result follows the BM25 list, not the ids.
    assert [c.id for c in fuse(dense, bm25, dense_weight=0.5, k=60)] == [5, 7]


def test_score_fusion_values_by_hand():
    # BM25 best 9; dense best 0.9, last 0.1 (spread 0.8). A score a candidate lacks counts 0.
    ranked = score_fusion(fuse(BM25, DENSE, dense_weight=0.5, k=60), DENSE, dense_share=0.25)
    by_id = {c.id: c for c in ranked}
    assert math.isclose(by_id[1].rrf, 0.75 * 1.0 + 0.25 * 0.0)
    assert math.isclose(by_id[3].rrf, 0.75 * by_id[3].bm25 / 9.0 + 0.25 * 1.0)
    assert math.isclose(by_id[4].rrf, 0.25 * (0.8 - 0.1) / 0.8)
    assert math.isclose(by_id[2].rrf, 0.75 * by_id[2].bm25 / 9.0)
    assert [c.id for c in ranked] == sorted(by_id, key=lambda i: -by_id[i].rrf)
    # Unlike ranks, scores see that 3's dense lead is large: with more dense share it passes 1.
    assert [c.id for c in score_fusion(fuse(BM25, DENSE, dense_weight=0.5, k=60), DENSE, dense_share=0.6)][0] == 3
    # Without one of the lists there is nothing to combine: the fused order stays.
    fused = fuse(BM25, [], dense_weight=0.5, k=60)
    assert score_fusion(fused, []) is fused


def test_stopwords_left_out_unless_nothing_else():
    assert fts_query("What did Caroline paint?") == '"Caroline" OR "paint"'
    # A query made only of stopwords still searches for them rather than for nothing.
    assert fts_query("who is it") == '"who" OR "is" OR "it"'

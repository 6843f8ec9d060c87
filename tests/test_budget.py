"""Token counting (vendored o200k_base) and fitting ranked memories into a token budget."""

from __future__ import annotations

import os

import pytest
import tiktoken

from tinycontext.budget.tokens import TokenCounter, fit_budget, get_encoding
from tinycontext.errors import ConfigError


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("o200k_base")


@pytest.fixture(scope="module")
def official(shared_dir) -> tiktoken.Encoding:
    """tiktoken's own o200k_base, from the official file cached in ../shared (no network)."""
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(shared_dir / "tiktoken" / "cache")
    try:
        return tiktoken.get_encoding("o200k_base")
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


TEXTS = [
    "Hello, world!",
    "The user prefers dark mode and Vim keybindings.",
    "naïve café — 日本語のテキスト 🙂 with emoji",
    "  leading and trailing spaces\n\nand\tnewlines  ",
    "def f(x):\n    return x ** 2  # code\n",
    "1234567890 numbers 3.14159",
]


@pytest.mark.parametrize("text", TEXTS)
def test_counts_match_official_o200k_base(counter, official, text):
    assert counter.count(text) == len(official.encode_ordinary(text))


def test_vendored_encoding_equals_official(counter, official):
    assert counter.encoding._pat_str == official._pat_str
    assert counter.encoding._mergeable_ranks == official._mergeable_ranks
    assert counter.encoding.special_tokens_set == official.special_tokens_set
    assert counter.encoding.n_vocab == official.n_vocab


def test_special_token_text_is_counted_as_ordinary_text(counter, official):
    text = "before <|endoftext|> after <|endofprompt|>"
    n = counter.count(text)
    assert n == len(official.encode_ordinary(text))
    # As a special token it would be one token; as text it is several.
    assert n > len(official.encode(text, allowed_special="all"))
    with pytest.raises(ValueError):
        official.encode(text)  # what plain encode() would do to such a memory


def test_count_many_matches_count(counter):
    assert counter.count_many(TEXTS) == [counter.count(t) for t in TEXTS]
    assert counter.count_many([]) == []
    assert counter.count("") == 0


def test_unknown_encoding_is_config_error():
    get_encoding.cache_clear()
    with pytest.raises(ConfigError) as err:
        TokenCounter("no_such_encoding")
    assert "o200k_base" in err.value.message


# -- fit_budget ---------------------------------------------------------------------------------

def test_everything_fits():
    assert fit_budget([10, 20, 30], 100, 10) == ([0, 1, 2], [], None)


def test_long_item_does_not_hide_shorter_ones_after_it():
    chosen, skipped, nxt = fit_budget([10, 500, 10, 10], 50, 10)
    assert chosen == [0, 2, 3]
    assert skipped == [1]
    assert nxt is None


def test_limit_stops_and_pages_from_next_position():
    chosen, skipped, nxt = fit_budget([1] * 10, 100, 3)
    assert (chosen, skipped, nxt) == ([0, 1, 2], [], 3)


def test_exhausted_budget_leaves_trailing_items_for_the_next_page():
    tokens = [100] * 10
    chosen, skipped, nxt = fit_budget(tokens, 250, 10)
    assert chosen == [0, 1] and skipped == [] and nxt == 2


def test_paging_reaches_every_item_exactly_once():
    tokens = [30, 900, 50, 20, 70, 10, 60, 40, 80, 25, 15, 999]
    budget, limit = 100, 3
    seen: list[int] = []
    omitted: list[int] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        pages += 1
        assert pages <= len(tokens), "paging must terminate"
        chosen, skipped, nxt = fit_budget(tokens[offset:], budget, limit)
        assert sum(tokens[offset + p] for p in chosen) <= budget
        assert len(chosen) <= limit
        seen += [offset + p for p in chosen]
        omitted += [offset + p for p in skipped]
        assert nxt is None or nxt > 0, "every page must make progress"
        offset = None if nxt is None else offset + nxt
    # No item is returned twice, none is lost silently: each one is returned or reported omitted.
    assert len(seen) == len(set(seen))
    assert set(seen) | set(omitted) == set(range(len(tokens)))
    assert not set(seen) & set(omitted)
    assert {i for i, t in enumerate(tokens) if t > budget} <= set(omitted)


def test_nothing_fits_reports_all_and_has_no_next_page():
    assert fit_budget([500, 600], 100, 10) == ([], [0, 1], None)
    assert fit_budget([], 100, 10) == ([], [], None)

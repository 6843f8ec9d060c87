"""Token counting (tiktoken) and fitting ranked memories into a token budget."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Iterable, Sequence

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from ..errors import ConfigError

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# tiktoken builds o200k_base from a URL; we ship the same file (MIT) so counting never needs the
# network. The split pattern and specials below are tiktoken_ext.openai_public.o200k_base's.
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@functools.lru_cache(maxsize=4)
def get_encoding(name: str) -> tiktoken.Encoding:
    if name == "o200k_base":
        path = resources.files("tinycontext") / "data" / "o200k_base.tiktoken"
        ranks = load_tiktoken_bpe(str(path), expected_hash=O200K_SHA256)
        return tiktoken.Encoding(
            name="o200k_base",
            pat_str=_O200K_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        )
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # unknown name, or its file cannot be downloaded
        raise ConfigError(
            f"Cannot load tiktoken encoding {name!r}: {exc}. Use encoding_name='o200k_base' (bundled) "
            "or set TIKTOKEN_CACHE_DIR to a folder holding that encoding's file."
        ) from exc


class TokenCounter:
    def __init__(self, encoding_name: str = "o200k_base"):
        self.encoding = get_encoding(encoding_name)

    def count(self, text: str) -> int:
        # encode_ordinary: a memory may legitimately contain "<|endoftext|>"; count it as text.
        return len(self.encoding.encode_ordinary(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        # One by one: tiktoken's encode_ordinary_batch starts a new thread pool on every call, which
        # costs far more than it saves on the few short texts of a save (and contends with the embedder).
        return [self.count(text) for text in texts]


def fit_budget(tokens: Iterable[int], max_tokens: int, limit: int) -> tuple[list[int], list[int], int | None]:
    """Choose items in rank order, up to ``limit`` of them, whose token counts fit ``max_tokens``.

    An item that does not fit is skipped and filling continues, so one long memory never hides
    shorter ones ranked after it. Returns (chosen positions, skipped positions before the last
    chosen one, next position to page from or None when nothing is left). Items after the last
    chosen one that did not fit are left for the next page rather than reported as skipped, so
    paging from the returned position reaches every item; when nothing fits at all, every item is
    reported as skipped and there is no next page (only a larger budget helps).
    """
    tokens = list(tokens)
    chosen: list[int] = []
    skipped: list[int] = []
    used = 0
    for position, cost in enumerate(tokens):
        if len(chosen) >= limit:
            return chosen, skipped, position
        if used + cost <= max_tokens:
            chosen.append(position)
            used += cost
        else:
            skipped.append(position)
    if not chosen:
        return chosen, skipped, None
    after = chosen[-1] + 1
    return chosen, [p for p in skipped if p < after], after if after < len(tokens) else None

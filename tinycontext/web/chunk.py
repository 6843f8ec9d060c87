"""Markdown split on its structure into passages of roughly ``min_tokens``-``max_tokens`` tokens.

Blocks are headings, paragraphs, list runs, tables and fenced code; a passage is a run of blocks
of one section (the heading path stays the same), cut before it would pass ``max_tokens``. A block
longer than that is cut at lines, then sentences, then words. Every chunk's text is exactly
``markdown[start:end]``: original text, never rewritten. A passage also knows its units (its
paragraphs, or their lines and sentences when a paragraph is longer than half a passage): ranking
scores them too, so one sentence that answers is not drowned by the rest of its passage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..budget.tokens import TokenCounter

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
# A sentence ends at . ! ? before white space, or before a capitalised word when the space was lost
# ("the genome.We find": common in text pasted from PDFs and abstracts).
# CJK sentences end at 。！？ with no space after them.
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[a-z0-9)][.!?])(?=[A-Z][a-z])|(?<=[。！？])(?=\S)")
_WORD_GAP = re.compile(r"\s+")


@dataclass
class Chunk:
    text: str
    start: int
    end: int
    heading_path: tuple[str, ...]
    tokens: int
    position: int = 0  # order in the page
    units: tuple[tuple[int, int], ...] = ()  # (start, end) of its paragraphs / sentences, offsets into the page


@dataclass
class _Block:
    start: int
    end: int
    heading: tuple[int, str] | None = None  # (level, text) for a heading line


def _blocks(markdown: str) -> list[_Block]:
    """Blocks separated by blank lines, with headings and fenced code blocks always on their own."""
    blocks: list[_Block] = []
    start: int | None = None
    in_fence = False
    offset = 0
    for line in markdown.splitlines(keepends=True):
        stripped = line.strip()
        line_start, offset = offset, offset + len(line)
        line_end = line_start + len(line.rstrip("\r\n"))
        if in_fence:
            if _FENCE.match(line):
                blocks.append(_Block(start, line_end))
                start, in_fence = None, False
            continue
        if _FENCE.match(line):
            if start is not None:
                blocks.append(_Block(start, line_start))
            start, in_fence = line_start, True
            continue
        heading = _HEADING.match(stripped) if stripped.startswith("#") else None
        if heading or not stripped:
            if start is not None:
                blocks.append(_Block(start, line_start))
                start = None
            if heading:
                blocks.append(_Block(line_start, line_end, (len(heading.group(1)), heading.group(2))))
            continue
        if start is None:
            start = line_start
    if start is not None:
        blocks.append(_Block(start, len(markdown)))
    for block in blocks:  # no trailing whitespace inside a span
        while block.end > block.start and markdown[block.end - 1].isspace():
            block.end -= 1
    return [b for b in blocks if b.end > b.start]


def _pieces(markdown: str, start: int, end: int, max_tokens: int, counter: TokenCounter) -> list[tuple[int, int]]:
    """Cut [start, end) into spans of at most ``max_tokens``: at line breaks, sentence ends, words, and
    last between characters (a script without spaces, a long URL)."""
    if counter.count(markdown[start:end]) <= max_tokens:
        return [(start, end)]
    text = markdown[start:end]
    for splitter in (re.compile(r"\n+"), SENTENCE_END, _WORD_GAP):
        cuts = [m.end() for m in splitter.finditer(text)]
        if not cuts and splitter is not _WORD_GAP:
            continue
        bounds = [0, *cuts, len(text)]
        units = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]
        costs = counter.count_many([text[a:b] for a, b in units])
        if max(costs) > max_tokens:
            if splitter is not _WORD_GAP:
                continue
            units = [piece for unit, cost in zip(units, costs)
                     for piece in (_by_characters(text, *unit, max_tokens, counter) if cost > max_tokens else [unit])]
            costs = counter.count_many([text[a:b] for a, b in units])
        spans: list[tuple[int, int]] = []
        cur_start, cur_cost = None, 0
        for (a, b), cost in zip(units, costs):
            if cur_start is not None and cur_cost + cost > max_tokens:
                spans.append((cur_start, a))
                cur_start, cur_cost = None, 0
            if cur_start is None:
                cur_start = a
            cur_cost += cost
        spans.append((cur_start, len(text)))
        out = []
        for a, b in spans:
            while b > a and text[b - 1].isspace():
                b -= 1
            if b > a:
                out.append((start + a, start + b))
        return out


def _by_characters(text: str, start: int, end: int, max_tokens: int, counter: TokenCounter) -> list[tuple[int, int]]:
    """[start, end) of ``text`` cut between characters into spans of at most ``max_tokens``."""
    spans = []
    step = max(1, (end - start) * max_tokens // max(1, counter.count(text[start:end])))  # characters per span, first guess
    while start < end:
        stop = min(end, start + step)
        while stop - start > 1 and counter.count(text[start:stop]) > max_tokens:
            stop = start + max(1, (stop - start) * 3 // 4)
        spans.append((start, stop))
        start = stop
    return spans


def _units(markdown: str, start: int, end: int, tokens: int, max_tokens: int) -> list[tuple[int, int]]:
    """A piece of a block as ranking units: whole when it is at most ``max_tokens``, else its lines and sentences."""
    if tokens <= max_tokens:
        return [(start, end)]
    text = markdown[start:end]
    out = []
    for line in re.finditer(r"[^\n]+", text):
        bounds = [line.start(), *(line.start() + m.end() for m in SENTENCE_END.finditer(line.group())), line.end()]
        for a, b in zip(bounds, bounds[1:]):
            while b > a and text[b - 1].isspace():
                b -= 1
            if b > a:
                out.append((start + a, start + b))
    return out


def chunk_markdown(markdown: str, counter: TokenCounter, *, max_tokens: int = 160) -> list[Chunk]:
    """Passages of ``markdown`` in page order (see the module docstring)."""
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    cur: list[int] | None = None  # [start, end, tokens]
    cur_path: tuple[str, ...] = ()
    units: list[tuple[int, int]] = []

    def flush():
        nonlocal cur, units
        if cur is not None:
            text = markdown[cur[0]:cur[1]]
            chunks.append(Chunk(text, cur[0], cur[1], cur_path, counter.count(text), len(chunks), tuple(units)))
            cur, units = None, []

    for block in _blocks(markdown):
        if block.heading is not None:
            flush()
            level, text = block.heading
            path = [(lv, t) for lv, t in path if lv < level] + [(level, text)]
            cur_path = tuple(t for _, t in path)
            # The heading starts its section's first passage: it helps both the reader and BM25.
            cur = [block.start, block.end, counter.count(markdown[block.start:block.end])]
            continue
        for start, end in _pieces(markdown, block.start, block.end, max_tokens, counter):
            tokens = counter.count(markdown[start:end])
            if cur is not None and cur[2] + tokens + 1 <= max_tokens:
                cur[1], cur[2] = end, cur[2] + tokens + 1
            else:
                flush()
                cur = [start, end, tokens]
            units.extend(_units(markdown, start, end, tokens, max_tokens // 2))
    flush()
    return chunks

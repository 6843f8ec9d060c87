"""Markdown split on its structure into the page's own units: paragraphs, list items, table rows, code.

Blocks are headings, paragraphs, list runs, tables and fenced code; a list run is cut into its items
and a table into its rows, so a chunk is one paragraph, item, row or code block, returned whole or
not at all. A unit longer than ``max_tokens`` is cut at lines, then sentences, then words. Headings
are not chunks: they make the heading path of the chunks under them (the answer names it where it
changes). Every chunk's text is exactly ``markdown[start:end]``: original text, never rewritten.

Chunks of one section are grouped into passages of about ``passage_tokens`` (``Chunk.passage``):
ranking scores a chunk with its passage too, so a short reply is read with the messages around it.
A chunk also knows its units (itself, or its lines and sentences when it is longer than half a
passage): ranking scores them, so one sentence that answers is not drowned by the rest. ``gap`` is
what lies between a chunk and the one before it in the same section (whitespace, a table's rule
line): two neighbours shown together are one window of original text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..budget.tokens import TokenCounter
from .deadline import Deadline

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
# A sentence ends at . ! ? before white space, or before a capitalised word when the space was lost
# ("the genome.We find": common in text pasted from PDFs and abstracts).
# CJK sentences end at 。！？ with no space after them.
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[a-z0-9)][.!?])(?=[A-Z][a-z])|(?<=[。！？])(?=\S)")
_WORD_GAP = re.compile(r"\s+")
_LIST_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d{1,9}[.)])\s+\S")
_TABLE_ROW = re.compile(r"^\s*\|")
_TABLE_RULE = re.compile(r"^\s*\|?(?:\s*:?-{2,}:?\s*\|)+\s*:?-*:?\s*$")


@dataclass
class Chunk:
    text: str
    start: int
    end: int
    heading_path: tuple[str, ...]
    tokens: int
    position: int = 0  # order in the page
    units: tuple[tuple[int, int], ...] = ()  # (start, end) of itself or its sentences, offsets into the page
    passage: int = 0  # the passage (run of chunks of one section) it belongs to
    gap: str | None = None  # markdown between the previous chunk and this one, when both are in one section


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


def _items(markdown: str, block: _Block) -> list[tuple[int, int]]:
    """A block as the page's own units: a list run as its items, a table as its rows (rule lines left out),
    anything else whole."""
    text = markdown[block.start:block.end]
    lines = [(m.start(), m.end()) for m in re.finditer(r"[^\n]+", text)]
    first = text[lines[0][0]:lines[0][1]] if lines else ""
    if _LIST_ITEM.match(first):
        starts = [a for a, b in lines if _LIST_ITEM.match(text[a:b])]
        bounds = [*starts, len(text)]
        spans = [(bounds[i], bounds[i + 1]) for i in range(len(starts))]
    elif _TABLE_ROW.match(first) and all(_TABLE_ROW.match(text[a:b]) for a, b in lines):
        spans = [(a, b) for a, b in lines if not _TABLE_RULE.match(text[a:b])]
    else:
        return [(block.start, block.end)]
    out = []
    for a, b in spans:
        while b > a and text[b - 1].isspace():
            b -= 1
        if b > a:
            out.append((block.start + a, block.start + b))
    return out


def chunk_markdown(markdown: str, counter: TokenCounter, *, max_tokens: int = 256,
                   passage_tokens: int = 160, deadline: Deadline | None = None) -> list[Chunk]:
    """The page's units in page order (see the module docstring); TimeoutError past the ``deadline``."""
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    cur_path: tuple[str, ...] = ()
    section_start = True  # the next chunk starts a section (no gap, a new passage)
    passage, passage_fill = -1, passage_tokens
    for block in _blocks(markdown):
        if deadline is not None:
            deadline.check()
        if block.heading is not None:
            level, text = block.heading
            path = [(lv, t) for lv, t in path if lv < level] + [(level, text)]
            cur_path = tuple(t for _, t in path)
            section_start = True
            continue
        spans = [piece for a, b in _items(markdown, block) for piece in _pieces(markdown, a, b, max_tokens, counter)]
        costs = counter.count_many([markdown[a:b] for a, b in spans])
        for (start, end), tokens in zip(spans, costs):
            if section_start or passage_fill + tokens > passage_tokens:
                passage, passage_fill = passage + 1, 0
            passage_fill += tokens
            gap = None if section_start or not chunks else markdown[chunks[-1].end:start]
            units = tuple(_units(markdown, start, end, tokens, passage_tokens // 2))
            chunks.append(Chunk(markdown[start:end], start, end, cur_path, tokens, len(chunks), units, passage, gap))
            section_start = False
    return chunks

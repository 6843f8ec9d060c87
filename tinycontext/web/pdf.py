"""PDF to Markdown for scrape_urls: text with headings and paragraphs, read by pypdf (pure Python).

PDF text is positioned runs, not a document tree. Runs on one baseline make a line; a font clearly
larger than the body's makes a heading (levels by size); a wider vertical gap, a page break after
a finished sentence or a change of size starts a paragraph; lines repeated on most pages (running
headers, footers, page numbers) are dropped; words hyphenated across lines are joined. Nothing in
the PDF is executed (no JavaScript, no forms, no embedded files are read).
"""

from __future__ import annotations

import io
import logging
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass

from pypdf import PdfReader
from pypdf.errors import PyPdfError

from .deadline import Deadline
from .pages import ExtractedPage

log = logging.getLogger(__name__)

_HEADING_RATIO = 1.15  # a line this much larger than the body font is a heading
_HEADING_MAX_CHARS = 150
_PARAGRAPH_GAP = 1.5  # a gap this many body line spacings starts a paragraph
_DIGITS = re.compile(r"\d+")
_BULLET = re.compile(r"^(?:[•◦▪‣∙●○■□–]|-(?=\s))\s*")
_SENTENCE_DONE = re.compile(r"[.!?:;)\]\"”’]$")


@dataclass
class _Line:
    page: int
    x: float
    y: float
    size: float
    text: str


def _page_lines(page, number: int) -> list[_Line]:
    lines: list[_Line] = []

    def visit(text, cm, tm, _font, font_size):
        if not text or not text.strip():
            return
        # Text space to page space: the text matrix, then the current transformation matrix.
        x = tm[4] * cm[0] + tm[5] * cm[2] + cm[4]
        y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]
        scale = math.hypot(tm[2] * cm[0] + tm[3] * cm[2], tm[2] * cm[1] + tm[3] * cm[3]) or 1.0
        size = round(float(font_size or 0) * scale, 1)
        for i, part in enumerate(text.split("\n")):
            if not part.strip():
                continue
            last = lines[-1] if lines else None
            if i == 0 and last and last.page == number and abs(last.y - y) < max(size, 1.0) * 0.5:
                last.text += part
                last.size = max(last.size, size)
            else:
                lines.append(_Line(number, x, y, size, part))

    page.extract_text(visitor_text=visit)
    for line in lines:
        line.text = " ".join(line.text.split())
    return [line for line in lines if line.text]


def _drop_running_lines(lines: list[_Line], pages: int) -> list[_Line]:
    """Headers, footers and page numbers: the same text (digits aside) on at least half the pages."""
    if pages < 3:
        return lines
    pages_of: dict[str, set[int]] = {}
    for line in lines:
        pages_of.setdefault(_DIGITS.sub("#", line.text), set()).add(line.page)
    return [l for l in lines if len(pages_of[_DIGITS.sub("#", l.text)]) < max(3, pages / 2)]


def _join(previous: str, line: str) -> str:
    if previous.endswith("-") and len(previous) > 1 and previous[-2].isalpha() and line[:1].islower():
        return previous[:-1] + line
    return f"{previous} {line}"


def pdf_to_markdown(lines: list[_Line], pages: int) -> tuple[str, str]:
    """(Markdown, first heading) of the lines of a document."""
    lines = _drop_running_lines(lines, pages)
    if not lines:
        return "", ""
    weights = Counter()
    for line in lines:
        weights[line.size] += len(line.text)
    body = weights.most_common(1)[0][0]
    heading_sizes = sorted({l.size for l in lines if l.size >= body * _HEADING_RATIO}, reverse=True)
    level = {size: min(i + 1, 3) for i, size in enumerate(heading_sizes)}
    gaps = [a.y - b.y for a, b in zip(lines, lines[1:]) if a.page == b.page and a.size == b.size == body and a.y > b.y]
    spacing = statistics.median(gaps) if gaps else body * 1.2
    blocks: list[str] = []
    first_heading = ""
    current = ""
    item_x = 0.0  # where the current block's first line starts
    previous: _Line | None = None

    def flush():
        nonlocal current
        if current:
            blocks.append(current)
            current = ""

    for line in lines:
        is_heading = line.size in level and len(line.text) <= _HEADING_MAX_CHARS and any(c.isalpha() for c in line.text)
        if is_heading:
            if previous is not None and previous.size == line.size and current.startswith("#") and previous.page == line.page:
                current += " " + line.text  # a heading set on two lines
            else:
                flush()
                current = "#" * level[line.size] + " " + line.text
                first_heading = first_heading or line.text
            previous = line
            continue
        bullet = _BULLET.match(line.text)
        text = "- " + line.text[bullet.end():] if bullet else line.text
        new_paragraph = (
            previous is None or current.startswith("#") or bullet is not None
            or previous.size != line.size
            or (previous.page == line.page and (previous.y - line.y) > spacing * _PARAGRAPH_GAP)
            or (previous.page != line.page and _SENTENCE_DONE.search(current or "") is not None)
            or (previous.page == line.page and line.y > previous.y)  # a new column
            or (current.startswith("- ") and line.x <= item_x + 1)  # back to the margin after a list item
        )
        if new_paragraph:
            flush()
            current, item_x = text, line.x
        else:
            current = _join(current, text)
        previous = line
    flush()
    return "\n\n".join(blocks), first_heading


def extract_pdf(body: bytes, url: str, *, max_pages: int, deadline: Deadline | None = None):
    """The :class:`~tinycontext.web.extract.ExtractedPage` of a PDF's first ``max_pages`` pages
    (empty when it cannot be read: encrypted, damaged); TimeoutError past the ``deadline`` (checked per page)."""
    try:
        reader = PdfReader(io.BytesIO(body))
        if reader.is_encrypted and not reader.decrypt(""):
            return ExtractedPage(url, "", "")
        count = min(len(reader.pages), max_pages)
        lines = []
        for number in range(count):
            if deadline is not None:
                deadline.check()
            lines += _page_lines(reader.pages[number], number)
        meta_title = (reader.metadata.title or "").strip() if reader.metadata else ""
    except (PyPdfError, ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        log.info("unreadable PDF %s: %s", url, exc)
        return ExtractedPage(url, "", "")
    markdown, heading = pdf_to_markdown(lines, count)
    return ExtractedPage(url, meta_title or heading or (lines[0].text[:120] if lines else ""), markdown)

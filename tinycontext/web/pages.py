"""The page types the web stages hand each other: extract and pdf make an :class:`ExtractedPage`,
scrape ranks it into a :class:`PageResult`, present fits those into the answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from .chunk import Chunk
from .fetch import FetchResult


@dataclass
class Link:
    url: str
    text: str


@dataclass
class ExtractedPage:
    url: str
    title: str
    markdown: str
    links: list[Link] = field(default_factory=list)
    cut: bool = False  # the page had more text than extraction was allowed to read


@dataclass
class ScrapeItem:
    url: str
    query: str | None = None

    @property
    def ranked(self) -> bool:
        return bool(self.query) and self.query.strip() != "*"


@dataclass
class PageResult:
    """One item's fetched, extracted and ranked page (before the budget is applied)."""

    item: ScrapeItem
    fetch: FetchResult
    outcome: str
    title: str = ""
    chunks: list[Chunk] = field(default_factory=list)  # best first when ranked, else page order
    links: list[Link] = field(default_factory=list)  # best first when ranked
    markdown_chars: int = 0
    note: str = ""  # e.g. that the page was read only up to scrape_max_chars

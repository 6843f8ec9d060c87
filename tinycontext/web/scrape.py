"""scrape_urls: fetch pages, keep their main content, hand back the passages that answer a query.

Per item ``{url, query?}``: fetch (any :class:`~tinycontext.web.fetch.Fetcher`; httpx behind the
SSRF guard by default), extract Markdown (HTML, plain text or PDF), split it into passages, rank
them with the engine's hybrid search against the query, and fill ONE token budget shared by all items with the best
passages (each item's best first, then each item's second...). Without a query (or ``"*"``) a page
is read in order. Passages are original text with the URL, title, heading path and character
offsets into the extracted Markdown. Every item gets an outcome; one bad URL never raises.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .. import telemetry
from ..budget.tokens import TokenCounter
from ..config import TinyContextConfig
from ..models.backends import open_embedder
from ..errors import InvalidInputError
from ..budget.render import check_agent_budget
from .chunk import chunk_markdown
from .deadline import SOFT_SHARE, Deadline
from .extract import extract_page
from .fetch import Fetcher, FetchResult, HttpFetcher
from .pages import ExtractedPage, PageResult, ScrapeItem
from .present import links_budget, scrape_page
from .rank import bm25_ranking, rank_chunks, rank_passages

MAX_ITEMS = 5
MAX_QUERY_CHARS = 1000
ORDERS = ("page", "rank")
# How pages are fetched: see tinycontext.web.browser.fetcher for browser and auto.
BACKENDS = ("http", "browser", "auto")


def check_items(items: Any) -> list[ScrapeItem]:
    """1-5 items, each a URL string or ``{url, query?}``; a malformed request is an InvalidInputError
    (a well-formed but bad URL is not: it becomes that item's outcome)."""
    if isinstance(items, (str, dict)):
        items = [items]
    if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= MAX_ITEMS:
        raise InvalidInputError(f"Give 1 to {MAX_ITEMS} items, each a URL or {{url, query}}.")
    out = []
    for i, raw in enumerate(items):
        if isinstance(raw, ScrapeItem):
            raw = {"url": raw.url, "query": raw.query}
        if isinstance(raw, str):
            raw = {"url": raw}
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str) or not raw["url"].strip():
            raise InvalidInputError(f"Item {i}: needs a 'url' string.")
        unknown = set(raw) - {"url", "query"}
        if unknown:
            raise InvalidInputError(f"Item {i}: unknown keys {sorted(unknown)}; use url and query.")
        query = raw.get("query")
        if query is not None and (not isinstance(query, str) or len(query) > MAX_QUERY_CHARS):
            raise InvalidInputError(f"Item {i}: query must be a string of at most {MAX_QUERY_CHARS} characters.")
        out.append(ScrapeItem(raw["url"].strip(), query.strip() if query and query.strip() else None))
    return out


# What decides the vectors an embedder makes (its cache, batch and thread settings do not).
_VECTOR_FIELDS = ("embedding_backend", "embedding_model", "models_dir", "embedding_url", "embedding_dimensions",
                  "dense_query_prefix", "dense_document_prefix", "embedding_query_params", "embedding_document_params")


def shared_embedder(engine, config: TinyContextConfig):
    """The memory ``engine``'s embedder when it embeds as ``config`` would (so a server holds one copy of
    the model); None otherwise, or when the engine runs keyword-only, and then scrape loads its own. An
    engine that kept an older package model for its database (the fast tier) does not embed as ``config``:
    pages are ranked with the model the settings name for a new database."""
    if engine is None or engine.embedder is None:
        return None
    same = all(getattr(engine.embedding_config, name) == getattr(config, name) for name in _VECTOR_FIELDS)
    return engine.embedder if same else None


@functools.lru_cache(maxsize=4)
def embedder_for(config: TinyContextConfig):
    """The embedder recall uses for this configuration (loaded once per process); None when the
    configuration runs keyword-only, and then passages are ranked by BM25 alone."""
    return open_embedder(config)[0]


# Page work (extraction, chunking, ranking) runs here rather than in asyncio's default executor: a
# page past its deadline is left to stop at its stage's next deadline check, and asyncio.run would
# wait for the default executor's threads before returning.
_EXECUTOR = ThreadPoolExecutor(max_workers=MAX_ITEMS, thread_name_prefix="tinycontext-scrape")


def _process(item: ScrapeItem, fetched: FetchResult, embedder, config: TinyContextConfig,
             counter: TokenCounter, deadline: Deadline | None = None, budget: int | None = None,
             links: bool = True, pages: int = 1) -> PageResult:
    if fetched.outcome != "ok":
        return PageResult(item, fetched, fetched.outcome)
    deadline = deadline or Deadline()
    page, chunks = _read(fetched, config, counter, deadline, links)
    note = f"the page was read up to {config.scrape_max_chars} characters of text (scrape_max_chars)" if page.cut else ""
    result = PageResult(item, fetched, "ok", title=page.title, markdown_chars=len(page.markdown), note=note)
    if not page.markdown.strip():
        result.outcome = "empty"
        return result
    result.chunks = list(chunks)
    result.links = page.links
    deadline.check()
    if item.ranked:
        with telemetry.operation("scrape.rank", mode="keyword" if embedder is None else "hybrid", chunks=len(result.chunks)):
            _rank(item, result, page, embedder, config, deadline, budget, pages)
        if deadline.cut:
            cut = (f"ranked partly by keywords alone: embedding stopped at {SOFT_SHARE:.0%} of "
                   f"web_item_timeout={config.web_item_timeout:g} s")
            result.note = f"{result.note}; {cut}" if result.note else cut
    return result


# Pages read lately (text and units), by what decides them: the body's hash, URL and type, and the caps. An
# unchanged page asked again (the agent's next question on it) is not extracted and chunked again, as its
# units are not embedded again (the embedder's cache is keyed by text). Chunks are never changed once made.
PAGE_CACHE_SIZE = 16
_pages: OrderedDict[tuple, tuple[ExtractedPage, list]] = OrderedDict()
_pages_lock = threading.Lock()


def clear_page_cache() -> None:
    """Forget the pages read (a benchmark's cold call reads its pages as new)."""
    with _pages_lock:
        _pages.clear()


def _read(fetched: FetchResult, config: TinyContextConfig, counter: TokenCounter, deadline: Deadline,
          links: bool) -> tuple[ExtractedPage, list]:
    """The page's extracted text (at most scrape_max_chars) and all its units: every unit is ranked, by BM25 at
    least (scrape_max_chunks bounds those embedded)."""
    key = (hashlib.sha256(fetched.body).digest(), fetched.final_url or fetched.url, fetched.content_type, fetched.charset,
           links, counter.encoding.name, config.scrape_pdf_max_pages, config.scrape_max_chars, config.scrape_chunk_tokens,
           config.scrape_passage_tokens)
    with _pages_lock:
        if key in _pages:
            _pages.move_to_end(key)
            return _pages[key]
    with telemetry.operation("scrape.extract", bytes=len(fetched.body)):  # links only if the answer can show them
        page = extract_page(fetched, pdf_max_pages=config.scrape_pdf_max_pages, max_chars=config.scrape_max_chars,
                            deadline=deadline, links=links)
    deadline.check()
    chunks: list = []
    if page.markdown.strip():
        with telemetry.operation("scrape.chunk") as op:
            chunks = chunk_markdown(page.markdown, counter, max_tokens=config.scrape_chunk_tokens,
                                    passage_tokens=config.scrape_passage_tokens, deadline=deadline)
            op.set(chunks=len(chunks), tokens=sum(chunk.tokens for chunk in chunks))
    read = (page, chunks)
    with _pages_lock:
        _pages[key] = read
        while len(_pages) > PAGE_CACHE_SIZE:
            _pages.popitem(last=False)
    return read


def _rank(item: ScrapeItem, result: PageResult, page: ExtractedPage, embedder, config: TinyContextConfig,
          deadline: Deadline, budget: int | None, pages: int) -> None:
    order = rank_chunks(item.query, result.chunks, embedder, config, deadline, budget, pages)
    result.chunks = [result.chunks[i] for i, _ in order]
    # No links were collected when the answer has no room for them (below LINKS_FROM_TOKENS).
    # Related links share a word with the query (navigation and sidebars do not, and would eat the
    # budget); those are ranked like passages.
    texts = [f"{l.text} {l.url}" for l in page.links]
    related = [i for i, _ in bm25_ranking(item.query, texts)]
    link_order = rank_passages(item.query, [texts[i] for i in related], embedder, config, deadline) if related else []
    result.links = [page.links[related[j]] for j, _ in link_order]


async def afetch_and_rank(items: Sequence[ScrapeItem], *, config: TinyContextConfig, fetcher: Fetcher | None = None,
                          embedder=None, max_tokens: int | None = None) -> list[PageResult]:
    """Fetch, extract and rank every item concurrently, each within ``web_item_timeout`` seconds; ranked
    deep enough for an equal share of ``max_tokens`` (default ``scrape_max_tokens``) per item."""
    own = fetcher is None
    fetcher = fetcher or HttpFetcher(config)
    loop = asyncio.get_running_loop()
    counter = TokenCounter(config.encoding_name)
    model: asyncio.Future | None = None
    total = config.scrape_max_tokens if max_tokens is None else max_tokens
    share = total // max(1, len(items))
    links = links_budget(total, config.scrape_links_max_tokens) > 0

    async def model_for_ranking():
        nonlocal model
        if embedder is not None:
            return embedder
        if model is None:  # loaded once for all items, and not cancelled with the item that asked first
            model = loop.run_in_executor(_EXECUTOR, embedder_for, config)
        return await asyncio.shield(model)

    async def one(item: ScrapeItem) -> PageResult:
        deadline = Deadline.within(config.web_item_timeout)
        fetched: FetchResult | None = None
        try:
            async with asyncio.timeout(config.web_item_timeout):
                with telemetry.operation("scrape.fetch", backend=getattr(fetcher, "name", "custom")) as op:
                    fetched = await fetcher.fetch(item.url)
                    op.set(outcome=fetched.outcome, status=fetched.status, bytes=len(fetched.body))
                ranker = await model_for_ranking() if item.ranked and fetched.outcome == "ok" else None
                # The page's stages run on a worker thread, in this item's context (their spans join the scrape's).
                return await loop.run_in_executor(_EXECUTOR, contextvars.copy_context().run, _process, item, fetched, ranker,
                                                  config, counter, deadline, share, links, len(items))
        except TimeoutError:
            late = FetchResult(url=item.url, final_url=fetched.final_url if fetched else item.url, outcome="timeout",
                               status=fetched.status if fetched else None,
                               detail=f"not read within web_item_timeout={config.web_item_timeout:g} s "
                                      f"(fetch, extraction and ranking together)")
            return PageResult(item, late, "timeout")

    try:
        return list(await asyncio.gather(*(one(item) for item in items)))
    finally:
        if own:
            await fetcher.aclose()


async def ascrape_urls(items: Any, max_tokens: int | None = None, *, order: str = "page",
                       config: TinyContextConfig | None = None, fetcher: Fetcher | None = None, embedder=None,
                       backend: str | None = None) -> dict:
    """Scrape 1-5 ``{url, query?}`` items into one answer of at most ``max_tokens`` tokens.

    Returns the structured content an agent receives (``results``: per item ``url``, ``outcome``,
    ``title``, ``passages`` with ``text``/``start``/``end`` and ``heading`` where it changes, ``links``; plus
    ``total_tokens``, ``max_tokens``, ``truncated``) and its rendering under ``text``; each of the
    two counts at most ``max_tokens``. ``order``: passages per page in ``page`` order or ``rank`` order.
    ``backend`` (default ``scrape_backend``): ``http``, ``browser`` or ``auto`` (see
    :mod:`tinycontext.web.browser.fetcher`); a ``fetcher`` given explicitly wins.
    """
    config = config or TinyContextConfig()
    parsed = check_items(items)
    budget = check_agent_budget(config.scrape_max_tokens if max_tokens is None else max_tokens)
    if order not in ORDERS:
        raise InvalidInputError(f"order must be one of {', '.join(ORDERS)}, got {order!r}.")
    backend = backend or config.scrape_backend
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    with telemetry.operation("scrape", backend=backend, items=len(parsed)) as op:
        own = fetcher is None and backend != "http"
        if own:
            from .browser.fetcher import fetcher_for  # Playwright is an optional extra

            fetcher = fetcher_for(backend, config)
        try:
            pages = await afetch_and_rank(parsed, config=config, fetcher=fetcher, embedder=embedder, max_tokens=budget)
        finally:
            if own:
                await fetcher.aclose()
        counter = TokenCounter(config.encoding_name)
        fitted = await asyncio.to_thread(scrape_page, pages, max_tokens=budget, counter=counter,
                                         links_max_tokens=config.scrape_links_max_tokens, order=order)
        op.set(pages=sum(p.outcome == "ok" for p in pages), tokens=fitted.tokens, max_tokens=budget, truncated=fitted.truncated)
        return {**fitted.structured, "text": fitted.text}


def scrape_urls(items: Any, max_tokens: int | None = None, *, order: str = "page", config: TinyContextConfig | None = None,
                fetcher: Fetcher | None = None, embedder=None, backend: str | None = None) -> dict:
    """Blocking :func:`ascrape_urls` (call that one from async code)."""
    return asyncio.run(ascrape_urls(items, max_tokens, order=order, config=config, fetcher=fetcher, embedder=embedder,
                                    backend=backend))

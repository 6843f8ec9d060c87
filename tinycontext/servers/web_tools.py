"""The web tools in the MCP server (:func:`register`) and the REST API (:func:`router`).

Thin adapters over :mod:`tinycontext.web`: the MCP text and structured content and the REST body
are the library's answer, already fitted to ``max_tokens``. The group is on when ``web_tools`` is.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Annotated, Any, Callable

from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from ..config import TinyContextConfig
from .tool_results import error_result
from ..errors import TinyContextError
from ..web.clock import current_datetime, render_datetime
from ..web.scrape import MAX_ITEMS as SCRAPE_MAX_ITEMS
from ..web.scrape import ascrape_urls, shared_embedder
from ..web.search import MAX_ITEMS as SEARCH_MAX_ITEMS
from ..web.search import SEARCH_MAX_TOKENS, asearch


class SearchItemModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(description="What to search the web for.")
    domains: list[str] | None = Field(None, description="Only results from these domains (and their subdomains).")


class ScrapeItemModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(description="http(s) URL of the page.")
    query: str | None = Field(None, description="What to look for on the page; omit or '*' for the page itself in order.")


def _split(answer: dict) -> tuple[str, dict]:
    structured = dict(answer)
    return structured.pop("text"), structured


async def _engine_embedder(engine: Callable[[], Any] | None, config: TinyContextConfig):
    """The memory engine's embedder, when ``engine()`` opens and embeds as ``config`` does."""
    if engine is None:
        return None
    try:
        opened = await asyncio.to_thread(engine)
    except TinyContextError:
        return None  # the memory side is broken; scrape still works with a model of its own
    return shared_embedder(opened, config)


def register(server, config: TinyContextConfig, *, engine: Callable[[], Any] | None = None) -> None:
    """Add search, scrape_urls and current_datetime to a FastMCP ``server`` when ``web_tools`` is on.
    ``engine`` (the server's engine getter) lends its embedder to scrape_urls when the model is the same."""
    if not config.web_tools:
        return

    async def answer(work) -> CallToolResult:
        try:
            text, structured = _split(await work())
        except TinyContextError as err:
            return error_result(err)
        return CallToolResult(content=[TextContent(type="text", text=text)], structuredContent=structured)

    @server.tool(
        description=(
            f"Search the web. Give 1-{SEARCH_MAX_ITEMS} items {{query, domains?}}; each gets the results in the "
            "search backend's order (title, url, snippet, date) and an outcome: ok, no_results, blocked, unavailable "
            "or invalid. 'domains' keeps only results from those sites and their subdomains. Then read the promising "
            f"pages with scrape_urls. Answers fit max_tokens (default {SEARCH_MAX_TOKENS})."
        ),
        annotations=ToolAnnotations(title="Search the web", readOnlyHint=True, openWorldHint=True),
    )
    async def search(
        items: Annotated[list[SearchItemModel], Field(description="Searches to run: {query, domains?} each.")],
        max_tokens: Annotated[int | None, Field(description="Token budget for the whole answer.")] = None,
    ) -> CallToolResult:
        raw = [i.model_dump(exclude_none=True) for i in items]
        return await answer(lambda: asearch(raw, max_tokens, config=config))

    @server.tool(
        description=(
            f"Read web pages (HTML, plain text, PDF) without paying for whole pages. Give 1-{SCRAPE_MAX_ITEMS} items "
            "{url, query?}: with a query you get only the passages of each page that answer it (original text, with "
            "character offsets, and the heading path where it changes) plus the page's most relevant links; without one (or '*') the page's main content "
            f"in order. One token budget (max_tokens, default {config.scrape_max_tokens}) is shared by all items. "
            "Each item has an outcome: ok, blocked, http_error, timeout, too_large, unsupported_type, empty, "
            "unavailable, invalid. Private and local addresses are refused."
        ),
        annotations=ToolAnnotations(title="Scrape web pages", readOnlyHint=True, openWorldHint=True),
    )
    async def scrape_urls(
        items: Annotated[list[ScrapeItemModel], Field(description="Pages to read: {url, query?} each.")],
        max_tokens: Annotated[int | None, Field(description="Token budget shared by all pages.")] = None,
        order: Annotated[str, Field(description="Passages of a page in 'page' order or best-first 'rank' order.")] = "page",
        backend: Annotated[str | None, Field(description=(
            "How to fetch: 'http'; 'browser' (a real browser runs the page's scripts); 'auto' (http, then the browser "
            "for a page whose HTML has no main content). Default: the scrape_backend setting."))] = None,
    ) -> CallToolResult:
        raw = [i.model_dump(exclude_none=True) for i in items]
        async def work():
            return await ascrape_urls(raw, max_tokens, order=order, config=config, backend=backend,
                                      embedder=await _engine_embedder(engine, config))

        return await answer(work)

    @server.tool(
        name="current_datetime",
        description="The current date and time (UTC and the server's local time). Use it for anything time-dependent.",
        annotations=ToolAnnotations(title="Current date and time", readOnlyHint=True, openWorldHint=False),
    )
    async def now_tool() -> CallToolResult:
        now = current_datetime()
        return CallToolResult(content=[TextContent(type="text", text=render_datetime(now))], structuredContent=now)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[SearchItemModel] = Field(description=f"1-{SEARCH_MAX_ITEMS} searches: {{query, domains?}} each.")
    max_tokens: int | None = Field(None, description="Token budget for the whole answer.")


class ScrapeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[ScrapeItemModel] = Field(description=f"1-{SCRAPE_MAX_ITEMS} pages: {{url, query?}} each.")
    max_tokens: int | None = Field(None, description="Token budget shared by all pages.")
    order: str = Field("page", description="Passages of a page in 'page' or 'rank' order.")
    backend: str | None = Field(None, description="http, browser or auto (default: scrape_backend).")


def router(get_config: Callable[[], TinyContextConfig], *, engine: Callable[[], Any] | None = None):
    """REST endpoints ``POST /search``, ``POST /scrape_urls``, ``GET /current_datetime`` (404 when
    ``web_tools`` is off). ``get_config`` is called once, at the first request; ``engine`` as for
    :func:`register`."""
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    config = functools.cache(get_config)
    api = APIRouter(tags=["web"])

    def enabled() -> TinyContextConfig:
        current = config()
        if not current.web_tools:
            raise HTTPException(404, "The web tools are disabled (web_tools=false).")
        return current

    # The body is the structured content exactly as the budget counted it (no re-serialization).
    @api.post("/search", response_model=None, summary="Search the web: results and an outcome per query, within max_tokens")
    async def search_endpoint(body: SearchRequest):
        current = enabled()
        answer = await asearch([i.model_dump(exclude_none=True) for i in body.items], body.max_tokens, config=current)
        return JSONResponse(_split(answer)[1])

    @api.post("/scrape_urls", response_model=None, summary="The passages of 1-5 pages that answer a query, within one token budget")
    async def scrape_endpoint(body: ScrapeRequest):
        current = enabled()
        answer = await ascrape_urls([i.model_dump(exclude_none=True) for i in body.items], body.max_tokens,
                                    order=body.order, config=current, backend=body.backend,
                                    embedder=await _engine_embedder(engine, current))
        return JSONResponse(_split(answer)[1])

    @api.get("/current_datetime", summary="UTC and local time now")
    def datetime_endpoint() -> dict[str, Any]:
        enabled()
        return current_datetime()

    return api

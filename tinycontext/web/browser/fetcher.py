"""Fetchers for ``scrape_urls`` that use the browser: ``backend="browser"`` renders every page in
Chromium; ``backend="auto"`` fetches over HTTP first and renders only pages whose static HTML has no
main content (a script-built page). Both keep the :class:`~tinycontext.web.fetch.Fetcher` contract:
one URL in, one result out, never an exception."""

from __future__ import annotations

import asyncio
import time
import uuid

from ...config import TinyContextConfig
from ...errors import InvalidInputError, TinyContextError
from ..extract import extract_page
from ..fetch import Fetcher, FetchResult, HttpFetcher
from ..guard import BlockedURLError
from .service import BrowserService, get_service

# Less main text than this in the static HTML (a "loading…" shell, a noscript notice): render it instead.
AUTO_MIN_CHARS = 200


class BrowserFetcher:
    """Each URL in its own throw-away browser session, behind the same SSRF guard as the HTTP fetcher."""

    name = "browser"

    def __init__(self, config: TinyContextConfig, *, service: BrowserService | None = None):
        self.config = config
        self.service = service or get_service(config)

    async def fetch(self, url: str) -> FetchResult:
        started = time.perf_counter()
        result = FetchResult(url=url, final_url=url)
        try:
            page = await self.service.acall("render_html", f"fetch-{uuid.uuid4().hex}", url=url)
        except BlockedURLError as exc:
            result.outcome, result.detail = ("invalid" if exc.details.get("reason") == "invalid_url" else "blocked"), exc.message
        except TinyContextError as exc:  # busy, browser missing or failing, page error
            result.outcome, result.detail = "unavailable", str(exc)
        else:
            html = page["html"].encode("utf-8")
            result.final_url, result.status = page["final_url"], page["status"]
            result.content_type, result.charset = "text/html", "utf-8"
            if page["status"] is not None and page["status"] >= 400:
                result.outcome, result.detail = "http_error", f"HTTP {page['status']}"
            elif len(html) > self.config.web_max_bytes:
                result.outcome, result.detail = "too_large", f"the rendered page exceeds {self.config.web_max_bytes} bytes"
            elif page["timed_out"] and not html:
                result.outcome, result.detail = "timeout", f"no page within {self.config.browser_timeout_seconds:g} s"
            else:
                result.body = html
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        return result

    async def aclose(self) -> None:
        """The browser belongs to the process's service; it outlives one scrape."""


class AutoFetcher:
    """HTTP first; the browser only for an HTML page whose static text has (almost) no main content."""

    name = "auto"

    def __init__(self, config: TinyContextConfig, *, http: Fetcher | None = None, browser: Fetcher | None = None):
        self.config = config
        self.http = http or HttpFetcher(config)
        self.browser = browser or BrowserFetcher(config)

    async def fetch(self, url: str) -> FetchResult:
        static = await self.http.fetch(url)
        if static.outcome != "ok" or static.content_type != "text/html":
            return static
        page = await asyncio.to_thread(extract_page, static, max_chars=self.config.scrape_max_chars)
        if len(page.markdown.strip()) >= AUTO_MIN_CHARS:
            return static
        rendered = await self.browser.fetch(static.final_url or url)
        return rendered if rendered.outcome == "ok" else static

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.browser.aclose()


def fetcher_for(backend: str, config: TinyContextConfig) -> Fetcher:
    """The fetcher for scrape's ``browser`` or ``auto`` backend."""
    if config.browser_backend == "off":
        raise InvalidInputError(f"backend={backend!r} needs the browser, which is off (browser_backend=off); use 'http'.")
    return BrowserFetcher(config) if backend == "browser" else AutoFetcher(config)

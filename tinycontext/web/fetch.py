"""Fetching pages: a small fetcher interface and its httpx implementation behind the SSRF guard.

A fetcher turns a URL into a :class:`FetchResult` and never raises for a bad URL or a bad server:
every failure is an ``outcome`` (``blocked``, ``http_error``, ``timeout``, ``too_large``,
``unsupported_type``, ``unavailable``, ``invalid``). Another fetcher (a browser) implements the
same ``fetch`` coroutine and plugs into :func:`tinycontext.web.scrape.ascrape_urls` unchanged.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass
from typing import Protocol

import httpx

from ..config import TinyContextConfig
from .guard import DECIDED, BlockedURLError, Decision, Guard, GuardedTransport
from .proxies import proxies_for

# Types we can turn into text; everything else is ``unsupported_type`` before its body is read.
HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain", "text/markdown", "text/x-markdown")
PDF_TYPES = ("application/pdf", "application/x-pdf")
READABLE_TYPES = HTML_TYPES + TEXT_TYPES + PDF_TYPES
# Read, then judged by their bytes (PDFs are often served as these).
SNIFFED_TYPES = ("application/octet-stream", "binary/octet-stream")
_CHUNK = 64 * 1024


@dataclass
class FetchResult:
    url: str
    outcome: str = "ok"
    final_url: str = ""
    status: int | None = None
    content_type: str = ""  # media type without parameters: text/html, text/plain
    charset: str | None = None  # from the Content-Type header
    body: bytes = b""
    detail: str = ""
    elapsed_ms: float = 0.0


class Fetcher(Protocol):
    """What scrape needs from a fetcher: one URL in, one result out, never an exception."""

    async def fetch(self, url: str) -> FetchResult: ...

    async def aclose(self) -> None: ...


def _media_type(header: str) -> tuple[str, str | None]:
    media, _, params = header.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip("'\"")
    return media.strip().lower(), charset


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
# Bytes that hardly occur in text (C0 controls but tab, newline, form feed, carriage return, escape):
# more than one in twenty of the first 4 KiB is binary (a stray NUL in a page is not).
_CONTROL = bytes(c for c in range(32) if c not in (9, 10, 12, 13, 27))


def _sniff(body: bytes) -> str:
    """What the bytes are: PDF by its magic (within the first KiB, as readers allow), binary when the
    start is full of control bytes (UTF-16 with a BOM aside), else HTML or plain text."""
    if b"%PDF-" in body[:1024]:
        return "application/pdf"
    head = body[:4096]
    if not head.startswith(_UTF16_BOMS) and sum(head.count(c) for c in _CONTROL) > len(head) // 20:
        return "application/octet-stream"
    start = body[:512].lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or b"<html" in start:
        return "text/html"
    return "text/plain"


class _Inflater:
    """Decompresses gzip/deflate without ever producing more than ``limit`` bytes (gzip bombs)."""

    def __init__(self, encoding: str):
        self.z = zlib.decompressobj(zlib.MAX_WBITS | 32) if encoding in ("gzip", "x-gzip", "deflate") else None

    def feed(self, data: bytes, room: int) -> bytes | None:
        """The decoded bytes of ``data``, or None when they would exceed ``room``."""
        if self.z is None:
            return data if len(data) <= room else None
        out = bytearray(self.z.decompress(data, room + 1))
        while self.z.unconsumed_tail and len(out) <= room:
            out += self.z.decompress(self.z.unconsumed_tail, room + 1 - len(out))
        return bytes(out) if len(out) <= room else None


class HttpFetcher:
    """httpx behind the guard: per-hop checks and pinned addresses, bounded time, size and redirects."""

    name = "http"

    def __init__(self, config: TinyContextConfig | None = None, *, guard: Guard | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.config = config or TinyContextConfig()
        self.guard = guard or Guard(allow_private_hosts=self.config.allow_private_hosts)
        timeout = self.config.web_fetch_timeout
        upstreams = proxies_for(self.config)
        if transport is None and upstreams:
            from .browser.proxy import ProxiedTransport  # the loopback guard proxy, chained to the upstreams

            transport = ProxiedTransport(self.guard, upstreams)
        self.client = httpx.AsyncClient(
            transport=transport or GuardedTransport(self.guard),
            follow_redirects=True,
            max_redirects=self.config.web_max_redirects,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            headers={"User-Agent": self.config.web_user_agent, "Accept-Encoding": "gzip, deflate",
                     "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,application/pdf;q=0.8,*/*;q=0.1"},
            trust_env=False,  # proxies from the environment would bypass the pinned connect
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def fetch(self, url: str) -> FetchResult:
        started = time.perf_counter()
        result = FetchResult(url=url, final_url=url)
        decision = await self.guard.adecide(url)
        if not decision.allowed:
            result.outcome = "invalid" if decision.reason == "invalid_url" else "blocked"
            result.detail = decision.detail or decision.reason
        else:
            try:
                async with asyncio.timeout(self.config.web_fetch_timeout):
                    await self._get(url, decision, result)
            except BlockedURLError as exc:
                result.outcome, result.detail = "blocked", exc.message
            except (TimeoutError, httpx.TimeoutException):
                result.outcome, result.detail = "timeout", f"no complete response within {self.config.web_fetch_timeout:g} s"
                result.body = b""
            except httpx.TooManyRedirects:
                result.outcome, result.detail = "http_error", f"more than {self.config.web_max_redirects} redirects"
            except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
                result.outcome, result.detail = "invalid", str(exc)
            except (httpx.HTTPError, zlib.error, OSError) as exc:
                result.outcome, result.detail = "unavailable", f"{type(exc).__name__}: {exc}"
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        return result

    async def _get(self, url: str, decision: Decision, result: FetchResult) -> None:
        limit = self.config.web_max_bytes
        # The first hop's decision goes with the request: the transport decides only the redirect hops.
        async with self.client.stream("GET", url, extensions={DECIDED: decision}) as response:
            result.final_url = str(response.url)
            result.status = response.status_code
            if response.status_code >= 400:
                result.outcome, result.detail = "http_error", f"HTTP {response.status_code} {response.reason_phrase}"
                return
            media, result.charset = _media_type(response.headers.get("content-type", ""))
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                result.outcome, result.detail = "too_large", f"Content-Length {declared} exceeds {limit} bytes"
                return
            if media and media not in READABLE_TYPES + SNIFFED_TYPES:
                result.outcome, result.detail = "unsupported_type", f"content type {media} is not HTML, plain text or PDF"
                return
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
                result.outcome, result.detail = "unsupported_type", f"content encoding {encoding}"
                return
            inflater = _Inflater(encoding)
            body = bytearray()
            async for raw in response.aiter_raw(_CHUNK):
                data = inflater.feed(raw, limit - len(body))
                if data is None:
                    result.outcome, result.detail = "too_large", f"body exceeds {limit} bytes (decoded)"
                    return
                body += data
            result.body = bytes(body)
            sniffed = _sniff(result.body)
            # The bytes win over the header: a PDF is read as a PDF whatever it is labelled, and
            # binary labelled as text is not handed back as text.
            result.content_type = "application/pdf" if sniffed == "application/pdf" else media or sniffed
            if media in SNIFFED_TYPES and sniffed != "application/pdf":
                result.outcome, result.detail = "unsupported_type", f"content type {media} is not HTML, plain text or PDF"
            elif result.content_type not in PDF_TYPES and sniffed == "application/octet-stream":
                result.outcome, result.detail = "unsupported_type", f"binary body served as {media or 'no type'}"
            elif result.content_type not in READABLE_TYPES:
                result.outcome, result.detail = "unsupported_type", "body is not text or PDF"

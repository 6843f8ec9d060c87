"""The browser's only way out: a loopback HTTP proxy that asks the SSRF guard about every connection.

Playwright's request routing does not see redirect hops, and the browser resolves names itself
after any check made beside it. Sending each browser context through this proxy closes both gaps:
every request (page, subresource, redirect hop, XHR, WebSocket, HTTPS tunnel) reaches the network
only through :meth:`GuardProxy._handle`, which lets :class:`~tinycontext.web.guard.Guard` validate
and resolve the target and then connects to exactly an address the guard checked.

Plain HTTP requests are forwarded one per connection (``Connection: close``), so a kept-alive
connection can never carry a second request to a host that was not checked. HTTPS and WebSocket
traffic arrives as ``CONNECT host:port`` and is tunnelled unread.

With upstream proxies configured (``proxy_server``, :mod:`tinycontext.web.proxies`) the same listener chains to
them: the guard's checked address goes to the upstream, never the name. The HTTP fetcher then sends its
requests through one of these listeners too (:class:`ProxiedTransport`), so both take one path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from .. import proxies
from ..proxies import CONNECT_TIMEOUT_S, MAX_HEAD_BYTES
from ..guard import Decision, Guard, tls_context

log = logging.getLogger(__name__)

# Marks the proxy's refusal, so that a navigation that ends on it (a redirect to a refused address)
# is told apart from a page that answers 403.
BLOCK_HEADER = "X-TinyContext-Blocked"
HEAD_TIMEOUT_S = 30
# Hop-by-hop headers a proxy must not forward (RFC 9110 7.6.1), plus the proxy's own.
_HOP = {b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization", b"proxy-authenticate", b"te",
        b"trailer", b"upgrade"}


class RefuseAll:
    """The guard of the browser-wide proxy: the browser's own requests (updates, hints, sign-in checks,
    whatever a new Chromium adds) are refused whatever the address; pages use their context's proxy."""

    async def adecide(self, url: str) -> Decision:
        return Decision(False, "browser_background", url, detail="the browser's own background request")


class GuardProxy:
    """One listener on 127.0.0.1 for one browser context (or one HTTP fetcher); ``on_block`` hears each refusal.
    ``route`` names the upstream proxy for a connection the guard allowed (None: connect directly)."""

    def __init__(self, guard: Guard | RefuseAll | Prechecked, on_block: Callable[[Decision], None],
                 route: Callable[[Decision], proxies.Upstream | None] | None = None):
        self.guard = guard
        self.on_block = on_block
        self.route = route
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
            pass  # a broken or malformed connection only ends itself
        except asyncio.CancelledError:
            pass  # close() ends open connections; asyncio's stream callback must not see a cancelled task
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        request_line, _, headers = head.partition(b"\r\n")
        method, target, version = request_line.decode("latin-1").split(" ", 2)
        if method.upper() == "CONNECT":
            # The scheme only fills in a default port, and the target always names one.
            url = f"https://{target}/"
        elif target.lower().startswith("http://"):
            url = target
        else:
            await _reply(writer, 400, "This proxy forwards absolute http:// requests and CONNECT only.")
            return
        decision = await self.guard.adecide(url)
        if not decision.allowed:
            self.on_block(decision)
            await _reply(writer, 403, f"Blocked by the SSRF guard: {decision.detail or decision.reason}",
                         {BLOCK_HEADER: decision.reason})
            return
        upstream = self.route(decision) if self.route else None
        try:
            if upstream is not None and upstream.scheme != "socks5" and method.upper() != "CONNECT":
                # Plain HTTP through an HTTP proxy: one absolute-form request naming the checked address.
                upstream_reader, upstream_writer = await proxies.connect(upstream)
                upstream_writer.write(proxies.absolute_form(upstream, method, url, decision.addresses[0], decision.port,
                                                            version, _kept(headers)))
            else:
                upstream_reader, upstream_writer = await self._connect(decision, upstream)
                if method.upper() != "CONNECT":
                    upstream_writer.write(_origin_form(method, url, version, headers))
        except (OSError, asyncio.TimeoutError) as exc:
            if upstream is None:
                raise
            # The refusal's own words, or only the kind of failure (an OSError's text names the proxy's address).
            why = str(exc) if isinstance(exc, proxies.ProxyRefusedError) else f"{type(exc).__name__} reaching the upstream proxy"
            await _reply(writer, 502, f"The upstream proxy did not connect: {why}")
            return
        try:
            if method.upper() == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await _pipe(reader, writer, upstream_reader, upstream_writer)
        finally:
            upstream_writer.close()

    async def _connect(self, decision: Decision, upstream: proxies.Upstream | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to one of the addresses the guard checked (never a fresh lookup), directly or tunnelled
        through ``upstream``."""
        error: OSError | None = None
        for address in decision.addresses:
            try:
                if upstream is not None:
                    return await proxies.tunnel(upstream, address, decision.port)
                return await asyncio.wait_for(asyncio.open_connection(address, decision.port), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                error = exc if isinstance(exc, OSError) else OSError(f"connect to {address} timed out")
        raise error or OSError("no address to connect to")


def _origin_form(method: str, url: str, version: str, headers: bytes) -> bytes:
    """The request as the origin server expects it: path only, hop-by-hop headers dropped, one request."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {path} {version}".encode("latin-1"), *_kept(headers), b"Connection: close", b"", b""]
    return b"\r\n".join(lines)


def _kept(headers: bytes) -> list[bytes]:
    """The request's header lines a proxy passes on (hop-by-hop ones dropped)."""
    return [line for line in headers.split(b"\r\n") if line and line.split(b":", 1)[0].strip().lower() not in _HOP]


async def _pipe(client_reader, client_writer, upstream_reader, upstream_writer) -> None:
    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(Exception):
                dst.write_eof()

    tasks = [asyncio.ensure_future(copy(client_reader, upstream_writer)), asyncio.ensure_future(copy(upstream_reader, client_writer))]
    try:
        # The origin's answer ending ends the exchange; a client half-close alone does not.
        await tasks[1]
    finally:
        tasks[0].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _reply(writer: asyncio.StreamWriter, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = message.encode()
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
                 f"{extra}Connection: close\r\n\r\n".encode() + body)
    await writer.drain()


class Prechecked:
    """The guard as a transport's own loopback proxy asks it: the decision the transport made for a
    request in flight is used (its checked addresses are the ones connected to), not made a second
    time with a second lookup. A connection the transport did not announce is decided afresh."""

    def __init__(self, guard: Guard):
        self.guard = guard
        self._held: dict[tuple[str | None, int | None], list[Decision]] = {}

    @contextlib.contextmanager
    def holding(self, decision: Decision):
        key = (decision.host, decision.port)
        self._held.setdefault(key, []).append(decision)
        try:
            yield
        finally:  # not taken (a kept-alive tunnel served the request): withdrawn, never left for another
            held = self._held.get(key, [])
            if decision in held:
                held.remove(decision)
            if not held:
                self._held.pop(key, None)

    async def adecide(self, url: str) -> Decision:
        held = self._held.get(self.guard.target(url))
        return held.pop() if held else await self.guard.adecide(url)


class ProxiedTransport(httpx.AsyncBaseTransport):
    """The HTTP fetcher's transport when upstream proxies are set: the guard decides every hop here (a refusal
    raises before anything is sent), then httpx talks to a loopback GuardProxy that connects to that
    decision's addresses (:class:`Prechecked`: one decision per request) through
    :meth:`~tinycontext.web.proxies.Proxies.route`'s upstream (or directly, for a bypassed target)."""

    def __init__(self, guard: Guard, upstreams: proxies.Proxies):
        self.guard, self.upstreams = guard, upstreams
        self._checked = Prechecked(guard)
        self._server = None
        self._inner = None
        self._lock: asyncio.Lock | None = None

    async def _ready(self):
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._inner is None:
                server = GuardProxy(self._checked, lambda decision: None, self.upstreams.route)
                await server.start()
                # No kept-alive connections to the listener: it serves one request per connection, and a
                # reused one could be closed under the next request ("Server disconnected").
                self._server, self._inner = server, httpx.AsyncHTTPTransport(
                    proxy=server.url, verify=tls_context(), limits=httpx.Limits(max_keepalive_connections=0))
        return self._inner

    async def handle_async_request(self, request):
        decision = await self.guard.adecide_hop(request)
        if not decision.allowed:
            raise decision.error()
        inner = await self._ready()
        with self._checked.holding(decision):
            return await inner.handle_async_request(request)

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()
            await self._server.close()

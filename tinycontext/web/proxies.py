"""Upstream proxies (``proxy_server``, ``proxy_username``, ``proxy_password``, ``proxy_bypass``): which one a
connection uses, and how a connection is opened through one.

The SSRF guard decides first. Page fetches (the HTTP fetcher and the browser) go through a
:class:`~tinycontext.web.browser.proxy.GuardProxy` on loopback, which lets the guard resolve and check the target
and then asks :meth:`Proxies.route` where to connect. The upstream proxy receives the address the guard
checked, never a name it could resolve again: ``CONNECT 93.184.216.34:443`` for a tunnel (TLS stays end to end,
SNI included, with the page's name), ``GET http://93.184.216.34/path`` with the page's ``Host`` header for plain
HTTP through an HTTP proxy, or a SOCKS5 CONNECT to the address. A refused target never reaches a proxy.
The search backends use the proxies too: ddgs through its own client, and SearXNG (operator configuration, not
checked by the guard) through httpx.

Proxies are operator settings, read from the environment or the config file; no tool request can name one.
The password never appears in a message, a log line, a telemetry attribute or a ``repr``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import itertools
import ssl
import threading
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import httpx

from ..config import TinyContextConfig

CONNECT_TIMEOUT_S = 15
MAX_HEAD_BYTES = 64 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443, "socks5": 1080}


class ProxyRefusedError(OSError):
    """The upstream proxy did not open the connection (its status, or the SOCKS reply): no credentials inside."""


@dataclass(frozen=True)
class Upstream:
    scheme: str
    host: str
    port: int
    username: str = ""
    password: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        """``scheme://host:port`` without credentials (safe to show)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def url_with_credentials(self) -> str:
        """For clients that take credentials only in the URL (ddgs); never shown."""
        if not self.username:
            return self.url
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{quote(self.username, safe='')}:{quote(self.password, safe='')}@{rest}"

    def authorization(self) -> bytes:
        """The ``Proxy-Authorization`` header line for an HTTP(S) proxy, or nothing."""
        if not self.username:
            return b""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")
        return f"Proxy-Authorization: Basic {token}\r\n".encode("latin-1")

    def httpx_proxy(self) -> httpx.Proxy:
        return httpx.Proxy(self.url, auth=(self.username, self.password) if self.username else None)


def _bypass_rule(entry: str):
    entry = entry.strip().lower()
    if entry == "*":
        return lambda host, addresses: True
    if entry == "<local>":
        return lambda host, addresses: "." not in host
    try:
        network = ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        domain = entry.lstrip("*").lstrip(".").rstrip(".")
        return lambda host, addresses: host == domain or host.endswith("." + domain)
    return lambda host, addresses: any(_in(network, a) for a in (host, *addresses))


def _in(network, address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]").split("%")[0]) in network
    except ValueError:
        return False


class Proxies:
    """The configured upstreams, taken in turn (thread-safe), and the bypass rules."""

    def __init__(self, config: TinyContextConfig):
        password = config.proxy_password.get_secret_value() if config.proxy_password else ""
        self.upstreams = tuple(Upstream(parts.scheme, parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme],
                                        config.proxy_username, password)
                               for parts in map(urlsplit, config.proxy_server))
        self._turn = itertools.cycle(self.upstreams)
        self._lock = threading.Lock()
        self._rules = [_bypass_rule(e) for e in config.proxy_bypass if e.strip()]

    def __bool__(self) -> bool:
        return bool(self.upstreams)

    def next(self) -> Upstream | None:
        if not self.upstreams:
            return None
        with self._lock:
            return next(self._turn)

    def bypassed(self, host: str, addresses: tuple[str, ...] = ()) -> bool:
        host = (host or "").strip("[]").rstrip(".").lower()
        return any(rule(host, addresses) for rule in self._rules)

    def for_host(self, host: str, addresses: tuple[str, ...] = ()) -> Upstream | None:
        """The next upstream for a connection to ``host``; None: connect directly (no proxy, or bypassed)."""
        return None if not self.upstreams or self.bypassed(host, addresses) else self.next()

    def route(self, decision) -> Upstream | None:
        """Per connection: the next upstream for a target the guard allowed (its host and checked addresses)."""
        return self.for_host(decision.host or "", decision.addresses)

    def sticky(self):
        """A route that keeps one upstream for its life (a browser session), bypass rules still per request."""
        chosen = self.next()
        return lambda decision: None if chosen is None or self.bypassed(decision.host or "", decision.addresses) else chosen


@functools.lru_cache(maxsize=16)
def proxies_for(config: TinyContextConfig) -> Proxies:
    """One :class:`Proxies` per configuration, so that turns continue across calls."""
    return Proxies(config)


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


async def connect(upstream: Upstream) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the proxy itself (TLS to an https:// proxy, checked against the system CAs)."""
    tls = ssl.create_default_context() if upstream.scheme == "https" else None
    return await asyncio.wait_for(asyncio.open_connection(upstream.host, upstream.port, ssl=tls, limit=MAX_HEAD_BYTES,
                                                          server_hostname=upstream.host if tls else None), CONNECT_TIMEOUT_S)


async def tunnel(upstream: Upstream, address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A byte stream to ``address:port`` (a checked IP address) through the upstream: HTTP CONNECT or SOCKS5."""
    reader, writer = await connect(upstream)
    try:
        if upstream.scheme == "socks5":
            await asyncio.wait_for(_socks5(reader, writer, upstream, address, port), CONNECT_TIMEOUT_S)
        else:
            target = _hostport(address, port)
            writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n".encode() + upstream.authorization() + b"\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT_S)
            status = head.split(b" ", 2)[1:2]
            if not status or not status[0].startswith(b"2"):
                raise ProxyRefusedError(f"the upstream proxy answered CONNECT with {status[0].decode('latin-1') if status else 'garbage'}")
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def _socks5(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: Upstream, address: str, port: int) -> None:
    from socksio import socks5

    conn = socks5.SOCKS5Connection()
    method = socks5.SOCKS5AuthMethod.USERNAME_PASSWORD if upstream.username else socks5.SOCKS5AuthMethod.NO_AUTH_REQUIRED
    conn.send(socks5.SOCKS5AuthMethodsRequest([method]))
    writer.write(conn.data_to_send())
    if conn.receive_data(await reader.readexactly(2)).method != method:
        raise ProxyRefusedError("the SOCKS5 proxy does not accept this authentication method")
    if upstream.username:
        conn.send(socks5.SOCKS5UsernamePasswordRequest(upstream.username.encode(), upstream.password.encode()))
        writer.write(conn.data_to_send())
        if not conn.receive_data(await reader.readexactly(2)).success:
            raise ProxyRefusedError("the SOCKS5 proxy refused the username or password")
    conn.send(socks5.SOCKS5CommandRequest.from_address(socks5.SOCKS5Command.CONNECT, (address, port)))
    writer.write(conn.data_to_send())
    head = await reader.readexactly(4)
    # The bound address that follows: IPv4, a name (length-prefixed) or IPv6, then the port.
    size = {1: 4, 4: 16}.get(head[3]) or (await reader.readexactly(1))[0]
    reply = conn.receive_data(head + (bytes([size]) if head[3] == 3 else b"") + await reader.readexactly(size + 2))
    if reply.reply_code != socks5.SOCKS5ReplyCode.SUCCEEDED:
        raise ProxyRefusedError(f"the SOCKS5 proxy could not connect (reply {reply.reply_code.name.lower()})")


def absolute_form(upstream: Upstream, method: str, url: str, address: str, port: int, version: str, headers: list[bytes]) -> bytes:
    """A plain-HTTP request for an HTTP proxy: the checked address in the request line, the page's own Host header."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    line = f"{method} http://{_hostport(address, port)}{path} {version}\r\n".encode("latin-1")
    return line + b"".join(h + b"\r\n" for h in headers) + upstream.authorization() + b"Connection: close\r\n\r\n"


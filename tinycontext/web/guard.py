"""SSRF guard: which URLs an outbound fetch may reach, and an httpx transport that enforces it.

One decision serves every fetcher. :func:`decide` validates the URL (http/https only), resolves the
host and classifies every address it resolves to; a URL is allowed only when all of them are public
(or ``allow_private_hosts`` is set). The decision carries the checked addresses, and
:class:`GuardedTransport` connects to exactly one of them while keeping the original Host header
and TLS server name, so nothing can re-resolve the name between the check and the connect (DNS
rebinding). A browser request interceptor calls :func:`decide` (or :meth:`Guard.adecide`) per
request; it cannot pin, so it should also refuse what the browser resolves differently.

Hosts are parsed the way browsers do (WHATWG URL): a host whose last label is a number is an IPv4
address in any legacy notation (``2130706433``, ``0177.0.0.1``, ``0x7f000001``, ``127.1``);
``localhost`` and ``*.localhost`` (trailing dots ignored) are loopback without asking DNS.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

import httpx

from ..errors import TinyContextError

ALLOWED_SCHEMES = ("http", "https")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

_HEX = re.compile(r"^0x[0-9a-f]*$")
_OCT = re.compile(r"^0[0-7]*$")
_DEC = re.compile(r"^[0-9]+$")
_MAX_HOST = 253


class BlockedURLError(TinyContextError):
    """An outbound request the SSRF guard refused; ``details['reason']`` says why."""

    code = "blocked"


@dataclass(frozen=True)
class Decision:
    """Whether a URL may be fetched. ``reason`` is ``"ok"`` or a stable refusal code:

    ``invalid_url``, ``scheme_not_allowed``, ``unresolvable``, or the class of the first non-public
    address: ``loopback``, ``private``, ``link_local``, ``multicast``, ``reserved``, ``unspecified``,
    ``not_global``. ``addresses`` are the checked addresses (connect only to these).
    """

    allowed: bool
    reason: str
    url: str
    host: str | None = None
    port: int | None = None
    addresses: tuple[str, ...] = field(default_factory=tuple)
    detail: str = ""

    def error(self) -> BlockedURLError:
        return BlockedURLError(f"{self.url!r} refused: {self.detail or self.reason}", reason=self.reason, url=self.url)


def _number(part: str) -> int | None:
    part = part.lower()
    if _HEX.match(part):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8) if _OCT.match(part) else None
    if _DEC.match(part):
        return int(part)
    return None


def parse_ipv4_legacy(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a browser reads in ``host`` (WHATWG "ends in a number"), else None.

    Raises ValueError when the host ends in a number but is not a valid address (``1.2.3.4.5``,
    ``256.1.1.1``, ``08.1.1.1``): such a host is neither a name nor an address, so it is refused.
    """
    parts = host.split(".")
    if parts and parts[-1] == "":
        parts.pop()
    if not parts or not (_DEC.match(parts[-1]) or _HEX.match(parts[-1].lower())):
        return None
    numbers = [_number(p) for p in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise ValueError(f"{host!r} is not a valid IPv4 address")
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(parts)):
        raise ValueError(f"{host!r} is not a valid IPv4 address")
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def normalise_host(host: str) -> str:
    """Lower case, no trailing dots, IPv6 brackets removed."""
    return host.strip().strip("[]").rstrip(".").lower()


def _unwrap(ip: IPAddress) -> tuple[IPAddress, ...]:
    """The addresses to judge: an IPv6 address that only carries an IPv4 one (mapped, compatible,
    NAT64) is that IPv4 address; a tunnel address (6to4, Teredo) is judged with its IPv4 endpoint."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return (ip,)
    packed = ip.packed
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if packed[:12] == bytes(12) and int(ip) > 1:  # deprecated IPv4-compatible ::a.b.c.d
        return (ipaddress.IPv4Address(packed[12:]),)
    if ip in _NAT64:
        return (ipaddress.IPv4Address(packed[12:]),)
    if ip.sixtofour is not None:
        return (ip.sixtofour, ip)
    if ip.teredo is not None:
        return (ip.teredo[1], ip)
    return (ip,)


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_nets = lambda *cidrs: tuple(ipaddress.ip_network(c) for c in cidrs)  # noqa: E731
# IANA's special-purpose address registries (IPv4 and IPv6, as of 2025), rows not globally reachable,
# plus fec0::/10 (deprecated site-local): the standard library's is_global lags them in older Pythons
# (3.11 calls 192.0.0.8 and fec0::1 global). tests/test_web_guard.py holds the registry rows.
_NOT_GLOBAL = _nets(
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
    "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "240.0.0.0/4", "255.255.255.255/32",
    "::/128", "::1/128", "::ffff:0:0/96", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64", "2001::/23", "2001:2::/48",
    "2001:db8::/32", "2002::/16", "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10",
)
# Rows inside those blocks that IANA marks globally reachable (anycast services, ORCHIDv2, DRIP, AMT...).
_GLOBAL = _nets("192.0.0.9/32", "192.0.0.10/32", "2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:3::/32",
                "2001:4:112::/48", "2001:20::/28", "2001:30::/28")


def _kind(ip: IPAddress) -> str:
    if any(ip in net for net in _GLOBAL if net.version == ip.version):
        return "public"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private or (ip.version == 4 and ip in _CGNAT):
        return "private"
    if not ip.is_global or any(ip in net for net in _NOT_GLOBAL if net.version == ip.version):
        return "not_global"
    return "public"


def classify(address: str | IPAddress) -> str:
    """``"public"`` or the class of a non-public address (see :class:`Decision`)."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%")[0])
    for candidate in _unwrap(ip):
        kind = _kind(candidate)
        if kind != "public":
            return kind
    return "public"


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for ``host`` (raises OSError when it gives none)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


# A request extension: the Decision its sender already made for the request's target, so the
# transport uses it for that hop instead of deciding (and resolving) a second time.
DECIDED = "tinycontext.decision"


class Guard:
    """The SSRF policy: ``allow_private_hosts`` and the resolver to use (tests inject one)."""

    def __init__(self, *, allow_private_hosts: bool = False, resolver: Resolver | None = None):
        self.allow_private_hosts = allow_private_hosts
        self.resolver = resolver or system_resolver

    def _parse(self, url: str) -> Decision | tuple[str, int, list[IPAddress] | None]:
        """A refusal, or (host, port, literal addresses or None when the host is a name)."""
        if not isinstance(url, str) or not url.strip():
            return Decision(False, "invalid_url", str(url), detail="empty URL")
        try:
            parts = urlsplit(url.strip())
            scheme = parts.scheme.lower()
            raw_host = parts.hostname or ""
            port = parts.port
        except ValueError as exc:
            return Decision(False, "invalid_url", url, detail=str(exc))
        if scheme not in ALLOWED_SCHEMES:
            return Decision(False, "scheme_not_allowed", url, detail=f"scheme {scheme or '(none)'!r} is not http(s)")
        host = normalise_host(raw_host)
        if not host or len(host) > _MAX_HOST or any(c in host for c in " \t\r\n\x00/\\@"):
            return Decision(False, "invalid_url", url, detail="missing or malformed host")
        port = port or (443 if scheme == "https" else 80)
        if host == "localhost" or host.endswith(".localhost"):
            return host, port, [ipaddress.IPv4Address("127.0.0.1")]  # RFC 6761: never ask DNS
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            try:
                literal = parse_ipv4_legacy(host)
            except ValueError as exc:
                return Decision(False, "invalid_url", url, host, port, detail=str(exc))
        return host, port, None if literal is None else [literal]

    def _judge(self, url: str, host: str, port: int, addresses: list[IPAddress]) -> Decision:
        if not addresses:
            return Decision(False, "unresolvable", url, host, port, detail=f"{host} resolves to no address")
        pinned = tuple(str(a) for a in addresses)
        if not self.allow_private_hosts:
            for address in addresses:
                kind = classify(address)
                if kind != "public":
                    return Decision(False, kind, url, host, port, pinned, detail=f"{host} resolves to {kind} address {address}")
        return Decision(True, "ok", url, host, port, pinned)

    def target(self, url: str) -> tuple[str, int] | None:
        """The (host, port) a decision about ``url`` names, found without a lookup; None for a URL
        refused as it is written."""
        parsed = self._parse(url)
        return None if isinstance(parsed, Decision) else parsed[:2]

    def check(self, url: str) -> Decision | None:
        """The decision when it needs no resolution (bad URL, literal address, localhost), else None."""
        parsed = self._parse(url)
        if isinstance(parsed, Decision):
            return parsed
        host, port, literal = parsed
        return None if literal is None else self._judge(url, host, port, literal)

    def _resolved(self, url: str, host: str, port: int, found: list[str] | Exception) -> Decision:
        if isinstance(found, Exception):
            return Decision(False, "unresolvable", url, host, port, detail=f"cannot resolve {host}: {found}")
        try:
            addresses = [ipaddress.ip_address(a.split("%")[0]) for a in found]
        except ValueError as exc:
            return Decision(False, "unresolvable", url, host, port, detail=f"resolver gave a bad address: {exc}")
        return self._judge(url, host, port, addresses)

    def decide(self, url: str) -> Decision:
        """Validate, resolve and classify ``url`` (blocking DNS lookup)."""
        early = self.check(url)
        if early is not None:
            return early
        host, port, _ = self._parse(url)
        try:
            found: list[str] | Exception = self.resolver(host, port)
        except (OSError, UnicodeError) as exc:
            found = exc
        return self._resolved(url, host, port, found)

    async def adecide_hop(self, request: httpx.Request) -> Decision:
        """The decision for one request (each redirect hop is one): the :data:`DECIDED` one its sender made,
        taken once and only for the same target, else a new one."""
        url = str(request.url)
        made = request.extensions.pop(DECIDED, None)
        if made is not None and (made.host, made.port) == self.target(url):
            return made
        return await self.adecide(url)

    async def adecide(self, url: str) -> Decision:
        """:meth:`decide` with the DNS lookup in a worker thread."""
        early = self.check(url)
        if early is not None:
            return early
        host, port, _ = self._parse(url)
        try:
            found: list[str] | Exception = await asyncio.to_thread(self.resolver, host, port)
        except (OSError, UnicodeError) as exc:
            found = exc
        return self._resolved(url, host, port, found)


def decide(url: str, *, allow_private_hosts: bool = False, resolver: Resolver | None = None) -> Decision:
    """Module-level :meth:`Guard.decide` for callers without a :class:`Guard`."""
    return Guard(allow_private_hosts=allow_private_hosts, resolver=resolver).decide(url)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS client context per process (certificate checks on): building one reads the CA bundle, which
    cost 60-90 ms per scrape call on a loaded machine, more than fetching a loopback page."""
    return httpx.create_ssl_context()


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that checks every request (each redirect hop too) and pins the address.

    The request goes to the checked IP address; the Host header and the TLS server name (SNI and
    certificate check) stay those of the URL, so virtual hosts and HTTPS work unchanged.
    """

    def __init__(self, guard: Guard, inner: httpx.AsyncBaseTransport | None = None):
        self.guard = guard
        self.inner = inner or httpx.AsyncHTTPTransport(verify=tls_context())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        decision = await self.guard.adecide_hop(request)
        if not decision.allowed:
            raise decision.error()
        address = decision.addresses[0]
        headers = request.headers.copy()
        if "host" not in headers:
            headers["Host"] = request.url.netloc.decode("ascii")
        extensions = dict(request.extensions)
        if request.url.scheme == "https":
            extensions["sni_hostname"] = request.url.host
        pinned = httpx.Request(request.method, request.url.copy_with(host=address), headers=headers,
                               stream=request.stream, extensions=extensions)
        return await self.inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self.inner.aclose()


def rules(*, allow_private_hosts: bool = False) -> dict:
    """The policy :func:`decide` applies, as data (the management views show it): the schemes fetched,
    the address classes refused, and the special-purpose networks judged not globally reachable."""
    return {
        "schemes": list(ALLOWED_SCHEMES),
        "allow_private_hosts": allow_private_hosts,
        "refused": [] if allow_private_hosts else ["loopback", "private", "link_local", "multicast", "reserved",
                                                   "unspecified", "not_global"],
        "always_refused": ["invalid_url", "scheme_not_allowed", "unresolvable"],
        "every_address_checked": "a name is fetched only when every address it resolves to is public; the "
                                 "connection goes to a checked address (no second lookup)",
        "localhost": "localhost and *.localhost are loopback, never looked up",
        "ipv6_wrapping": "IPv4-mapped, IPv4-compatible, NAT64, 6to4 and Teredo addresses are judged by the IPv4 "
                         "address they carry",
        "not_global_networks": [str(net) for net in _NOT_GLOBAL],
        "global_exceptions": [str(net) for net in _GLOBAL],
    }

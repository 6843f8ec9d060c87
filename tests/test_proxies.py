"""Upstream proxies: the HTTP fetcher, SearXNG, ddgs and the browser connect through a local forward proxy (HTTP
CONNECT and absolute-form) or SOCKS5 proxy written here, which records what it is asked to reach. The guard
decides first: a proxy receives only checked addresses, never a refused target, and never a name to resolve."""

from __future__ import annotations

import base64
import json
import select
import shutil
import socket
import threading
from urllib.parse import urlsplit

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp.shared.memory import create_connected_server_and_client_session

from netguard import LocalServer, send
from test_web_search import FakeSearx
from tinycontext import TinyContextConfig
from tinycontext.config import load_config
from tinycontext.errors import ConfigError
from tinycontext.web.fetch import HttpFetcher
from tinycontext.web.proxies import Proxies
from tinycontext.web.scrape import scrape_urls
from tinycontext.web.search import search

PAGE = b"<html><head><title>Proxied</title></head><body><main><h1>Proxied page</h1>" + \
       b"<p>The proxied page says the river is long and wide.</p>" * 5 + b"</main></body></html>"
USER, PASSWORD = "crawler", "s3cret-proxy-password"


def _pipe(a: socket.socket, b: socket.socket) -> None:
    sockets = [a, b]
    while True:
        ready, _, _ = select.select(sockets, [], [], 10)
        if not ready:
            return
        for s in ready:
            data = s.recv(65536)
            if not data:
                return
            (b if s is a else a).sendall(data)


def _read_head(conn: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(1)
        if not chunk:
            break
        head += chunk
    return head


class ForwardProxy:
    """An HTTP proxy on 127.0.0.1: CONNECT tunnels and absolute-form requests, to loopback targets only. It records
    each request line and its Proxy-Authorization; ``status`` other than 200 refuses everything."""

    def __init__(self, status: int = 200):
        self.status = status
        self.seen: list[dict] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        with conn:
            head = _read_head(conn)
            if not head:
                return
            line, *headers = head.decode("latin-1").split("\r\n")
            fields = {h.split(":", 1)[0].lower(): h.split(":", 1)[1].strip() for h in headers if ":" in h}
            method, target, _ = line.split(" ", 2)
            self.seen.append({"method": method, "target": target, "auth": fields.get("proxy-authorization"),
                              "host": fields.get("host")})
            host, port = (target.rsplit(":", 1) if method == "CONNECT" else
                          (urlsplit(target).hostname, urlsplit(target).port or 80))
            if self.status != 200 or host not in ("127.0.0.1", "::1"):  # never beyond loopback
                conn.sendall(f"HTTP/1.1 {self.status if self.status != 200 else 403} No\r\nContent-Length: 0\r\n\r\n".encode())
                return
            with socket.create_connection((host, int(port))) as upstream:
                if method == "CONNECT":
                    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    parts = urlsplit(target)
                    kept = [h for h in headers if h and not h.lower().startswith(("proxy-authorization", "proxy-connection"))]
                    upstream.sendall(f"{method} {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n".encode()
                                     + "".join(h + "\r\n" for h in kept).encode() + b"\r\n")
                _pipe(conn, upstream)

    def close(self):
        self.sock.close()


class TlsForwardProxy(ForwardProxy):
    """The same proxy behind TLS (an ``https://`` proxy URL), with a certificate for 127.0.0.1 from ``cert``."""

    def __init__(self, cert: tuple[str, str]):
        import ssl

        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(*cert)
        super().__init__()
        self.url = f"https://127.0.0.1:{self.port}"

    def _serve(self, conn: socket.socket):
        try:
            wrapped = self.tls.wrap_socket(conn, server_side=True)
        except OSError:  # a client that refused our certificate
            conn.close()
            return
        super()._serve(wrapped)


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate and key for IP 127.0.0.1, written as PEM files."""
    pytest.importorskip("cryptography")
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test proxy")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "proxy.pem", tmp_path / "proxy.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class Socks5Proxy(ForwardProxy):
    """A SOCKS5 proxy on 127.0.0.1 (username/password auth) that records each CONNECT's address type and target."""

    def _serve(self, conn: socket.socket):
        with conn:
            def exactly(n: int) -> bytes:
                data = b""
                while len(data) < n:
                    chunk = conn.recv(n - len(data))
                    if not chunk:
                        raise ConnectionError
                    data += chunk
                return data

            _, count = exactly(2)
            methods = exactly(count)
            if b"\x02" not in methods:
                conn.sendall(b"\x05\xff")
                return
            conn.sendall(b"\x05\x02")
            _, ulen = exactly(2)
            user = exactly(ulen).decode()
            plen = exactly(1)[0]
            password = exactly(plen).decode()
            conn.sendall(b"\x01\x00")
            _, cmd, _, atype = exactly(4)
            if atype == 1:
                host = socket.inet_ntoa(exactly(4))
            elif atype == 4:
                host = socket.inet_ntop(socket.AF_INET6, exactly(16))
            else:
                host = exactly(exactly(1)[0]).decode()
            port = int.from_bytes(exactly(2), "big")
            self.seen.append({"method": "SOCKS5", "atype": atype, "target": f"{host}:{port}", "auth": f"{user}:{password}"})
            if host not in ("127.0.0.1", "::1"):
                conn.sendall(b"\x05\x02\x00\x01" + bytes(6))  # not allowed by ruleset
                return
            with socket.create_connection((host, port)) as upstream:
                conn.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + port.to_bytes(2, "big"))
                _pipe(conn, upstream)


@pytest.fixture
def site():
    with_image = PAGE.replace(b"</main>", b'<img src="http://refused.example/x.png"></main>')
    with LocalServer({"/page": lambda h: send(h, 200, PAGE), "/with-image": lambda h: send(h, 200, with_image),
                      "/search": FakeSearx()}) as server:
        yield server


@pytest.fixture
def proxy():
    p = ForwardProxy()
    yield p
    p.close()


def config(tmp_path, *servers, **extra) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, proxy_server=servers,
                             proxy_username=USER, proxy_password=PASSWORD, **extra)


def basic(user: str = USER, password: str = PASSWORD) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def fetch(cfg: TinyContextConfig, url: str):
    async def run():
        fetcher = HttpFetcher(cfg)
        try:
            return await fetcher.fetch(url)
        finally:
            await fetcher.aclose()

    return anyio.run(run)


def test_plain_http_goes_to_the_proxy_as_the_checked_address_with_the_page_host(tmp_path, site, proxy):
    # pages.localhost is loopback by rule (no DNS): the proxy gets the address, the page keeps its name.
    result = fetch(config(tmp_path, proxy.url), site.url("/page?x=1", host="pages.localhost"))
    assert result.outcome == "ok" and b"proxied page" in result.body
    (seen,) = proxy.seen
    assert seen == {"method": "GET", "target": f"http://127.0.0.1:{site.port}/page?x=1", "auth": basic(),
                    "host": f"pages.localhost:{site.port}"}
    assert site.requests[-1]["headers"]["Host"] == f"pages.localhost:{site.port}"


def test_the_proxied_transport_decides_each_request_once_for_itself_and_its_loopback_proxy(tmp_path, site, proxy):
    import httpx

    from tinycontext.web.browser.proxy import ProxiedTransport
    from tinycontext.web.guard import Guard

    lookups = []
    guard = Guard(allow_private_hosts=True, resolver=lambda host, port: lookups.append((host, port)) or ["127.0.0.1"])

    async def run():
        async with httpx.AsyncClient(transport=ProxiedTransport(guard, Proxies(config(tmp_path, proxy.url)))) as client:
            return [(await client.get(site.url(path, host="pages.test"))).status_code for path in ("/page", "/page?again=1")]

    assert anyio.run(run) == [200, 200] and len(proxy.seen) == 2
    # One decision (one lookup) per request: the loopback proxy connects to the transport's checked address.
    assert lookups == [("pages.test", site.port)] * 2


def test_an_https_proxy_is_reached_over_tls_checked_against_the_system_cas(tmp_path, site, monkeypatch):
    cert = self_signed(tmp_path)
    tls_proxy = TlsForwardProxy(cert)
    try:
        # Trusted: the proxy's certificate is the CA bundle the system default context reads (SSL_CERT_FILE).
        monkeypatch.setenv("SSL_CERT_FILE", cert[0])
        result = fetch(config(tmp_path, tls_proxy.url), site.url("/page", host="pages.localhost"))
        assert result.outcome == "ok" and b"proxied page" in result.body
        assert tls_proxy.seen == [{"method": "GET", "target": f"http://127.0.0.1:{site.port}/page", "auth": basic(),
                                   "host": f"pages.localhost:{site.port}"}]
        # Not trusted (the system CAs do not know it): nothing is sent, and the password does not leak.
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
        refused = fetch(config(tmp_path, tls_proxy.url), site.url("/page", host="pages.localhost"))
        assert refused.outcome != "ok" and len(tls_proxy.seen) == 1 and PASSWORD not in (refused.detail or "")
    finally:
        tls_proxy.close()


def test_a_refused_target_never_reaches_the_proxy(tmp_path, site, proxy):
    cfg = config(tmp_path, proxy.url).model_copy(update={"allow_private_hosts": False})
    result = fetch(cfg, site.url("/page"))
    assert result.outcome == "blocked" and proxy.seen == [] and site.requests == []
    answer = scrape_urls([{"url": site.url("/page", host="pages.localhost")}], config=cfg)
    assert answer["results"][0]["outcome"] == "blocked" and proxy.seen == []


def test_round_robin_across_two_proxies_and_the_bypass_list(tmp_path, site, proxy):
    other = ForwardProxy()
    try:
        cfg = config(tmp_path, proxy.url, other.url)
        for _ in range(4):
            assert fetch(cfg, site.url("/page")).outcome == "ok"
        assert len(proxy.seen) == 2 and len(other.seen) == 2
        for bypass in (["pages.localhost"], [".localhost"], ["127.0.0.0/8"], ["*"]):
            direct = cfg.model_copy(update={"proxy_bypass": tuple(bypass)})
            assert fetch(direct, site.url("/page", host="pages.localhost")).outcome == "ok"
        assert len(proxy.seen) + len(other.seen) == 4  # the bypassed fetches went direct
        assert fetch(cfg.model_copy(update={"proxy_bypass": ("example.com",)}), site.url("/page", host="pages.localhost")).outcome == "ok"
        assert len(proxy.seen) + len(other.seen) == 5
    finally:
        other.close()


def test_connect_tunnels_carry_the_checked_address(tmp_path, site, proxy):
    """What HTTPS and WebSocket traffic uses: CONNECT through the loopback guard proxy, chained to the upstream."""
    from tinycontext.web.browser.proxy import GuardProxy
    from tinycontext.web.guard import Guard

    async def run() -> bytes:
        guard_proxy = GuardProxy(Guard(allow_private_hosts=True), lambda d: None, Proxies(config(tmp_path, proxy.url)).route)
        await guard_proxy.start()
        try:
            import asyncio

            reader, writer = await asyncio.open_connection("127.0.0.1", guard_proxy.port)
            writer.write(f"CONNECT tunnel.localhost:{site.port} HTTP/1.1\r\nHost: tunnel.localhost:{site.port}\r\n\r\n".encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            writer.write(f"GET /page HTTP/1.1\r\nHost: tunnel.localhost:{site.port}\r\nConnection: close\r\n\r\n".encode())
            body = await reader.read()
            writer.close()
            return body
        finally:
            await guard_proxy.close()

    assert b"proxied page" in anyio.run(run)
    assert proxy.seen == [{"method": "CONNECT", "target": f"127.0.0.1:{site.port}", "auth": basic(), "host": f"127.0.0.1:{site.port}"}]


def test_a_proxy_that_refuses_is_an_outcome_without_the_password(tmp_path, site):
    refusing = ForwardProxy(status=407)
    try:
        result = fetch(config(tmp_path, refusing.url), site.url("/page"))
    finally:
        refusing.close()
    assert result.outcome == "http_error" and result.status == 407 and PASSWORD not in result.detail
    assert PASSWORD not in repr(Proxies(config(tmp_path, refusing.url)).upstreams)


def test_socks5_with_username_and_password(tmp_path, site):
    pytest.importorskip("socksio")
    socks = Socks5Proxy()
    try:
        server = f"socks5://127.0.0.1:{socks.port}"
        result = fetch(config(tmp_path, server), site.url("/page", host="pages.localhost"))
        assert result.outcome == "ok" and b"proxied page" in result.body
        assert socks.seen == [{"method": "SOCKS5", "atype": 1, "target": f"127.0.0.1:{site.port}", "auth": f"{USER}:{PASSWORD}"}]
        # SearXNG through the SOCKS proxy (httpx's own SOCKS support).
        found = search([{"query": "danube"}], config=config(tmp_path, server, search_backend="searxng", searxng_url=site.url("")))
        assert found["searches"][0]["outcome"] == "ok" and socks.seen[-1]["target"] == f"127.0.0.1:{site.port}"
    finally:
        socks.close()


def test_searxng_goes_through_the_proxy_unless_bypassed(tmp_path, site, proxy):
    cfg = config(tmp_path, proxy.url, search_backend="searxng", searxng_url=site.url(""))
    assert search([{"query": "danube"}], config=cfg)["searches"][0]["outcome"] == "ok"
    assert proxy.seen[-1]["method"] == "GET" and proxy.seen[-1]["target"].startswith(f"http://127.0.0.1:{site.port}/search?")
    assert proxy.seen[-1]["auth"] == basic()
    before = len(proxy.seen)
    assert search([{"query": "danube"}], config=cfg.model_copy(update={"proxy_bypass": ("127.0.0.1",)}))["searches"][0]["outcome"] == "ok"
    assert len(proxy.seen) == before


def test_ddgs_is_handed_the_proxy(tmp_path, proxy):
    """ddgs connects through the proxy; the test proxy reaches nothing beyond loopback, so the search fails there."""
    cfg = config(tmp_path, proxy.url, search_backend="ddgs", search_timeout=3)
    outcome = search([{"query": "danube"}], config=cfg)["searches"][0]
    assert outcome["outcome"] in ("unavailable", "blocked", "no_results")
    assert proxy.seen and all(s["method"] == "CONNECT" and s["auth"] == basic() for s in proxy.seen)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs a system Chromium")
def test_the_browser_chains_its_guard_proxy_to_the_upstream(tmp_path, site, proxy):
    pytest.importorskip("playwright")
    from tinycontext.web.browser.service import BrowserService
    from tinycontext.web.guard import Guard

    # Names resolve to nothing here (no DNS is asked): the page's image on refused.example is refused by the guard.
    service = BrowserService(config(tmp_path, proxy.url), guard=Guard(allow_private_hosts=True, resolver=lambda host, port: []))
    try:
        view = service.call("navigate", "t", url=site.url("/with-image", host="pages.localhost"))
        assert "Proxied page" in view["view"]
        assert "blocked a request to http://refused.example/x.png (unresolvable" in view["view"]
    finally:
        service.close()
    assert {"method": "GET", "target": f"http://127.0.0.1:{site.port}/with-image", "auth": basic(),
            "host": f"pages.localhost:{site.port}"} in proxy.seen
    assert all(s["target"].startswith(f"http://127.0.0.1:{site.port}/") for s in proxy.seen)  # the image never reached it


def test_proxies_are_operator_settings_only(tmp_path, site, proxy, monkeypatch):
    env = {"TINYCONTEXT_PROXY_SERVER": f"{proxy.url}, socks5://127.0.0.1:1080", "TINYCONTEXT_PROXY_BYPASS": "a.example, 10.0.0.0/8",
           "TINYCONTEXT_PROXY_USERNAME": USER, "TINYCONTEXT_PROXY_PASSWORD": PASSWORD}
    cfg = load_config(path=_empty(tmp_path), env=env)
    assert cfg.proxy_server == (proxy.url, "socks5://127.0.0.1:1080") and cfg.proxy_bypass == ("a.example", "10.0.0.0/8")
    assert PASSWORD not in repr(cfg) and PASSWORD not in json.dumps(cfg.model_dump(mode="json"))
    with pytest.raises(ConfigError) as refused:
        load_config(path=_empty(tmp_path), env={"TINYCONTEXT_PROXY_SERVER": f"http://{USER}:{PASSWORD}@127.0.0.1:3128"})
    assert PASSWORD not in str(refused.value) and "proxy_username" in str(refused.value)
    for bad in ("ftp://127.0.0.1:21", "127.0.0.1:3128", "http://127.0.0.1:3128/path"):
        with pytest.raises(ConfigError):
            load_config(path=_empty(tmp_path), env={"TINYCONTEXT_PROXY_SERVER": bad})
    # No request can name a proxy: the REST and MCP request models refuse the field, and nothing is proxied.
    from tinycontext.servers.fastapi_server import create_app
    from tinycontext.servers.mcp_server import build_server

    plain = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, tools=("memory", "web"))
    client = TestClient(create_app(plain), base_url="http://127.0.0.1")
    response = client.post("/scrape_urls", json={"items": [{"url": site.url("/page")}], "proxy_server": [proxy.url]})
    assert response.status_code == 422

    async def mcp():
        async with create_connected_server_and_client_session(build_server(plain)._mcp_server) as session:
            return await session.call_tool("scrape_urls", {"items": [{"url": site.url("/page")}], "proxy_server": [proxy.url]})

    assert anyio.run(mcp).isError
    assert proxy.seen == []


def _empty(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    return path

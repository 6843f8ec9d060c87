"""SSRF guard: URL validation, host notations, address classes, pinning, redirects, config.

Refusals of non-loopback addresses are tested through the decision only (no packet is sent); the
end-to-end refusals use loopback notations against a server started here, with ``loopback_only``
failing the test if anything tries to leave loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress

import httpx
import pytest

from netguard import LocalServer, loopback_only, redirect, send  # noqa: F401  (fixture)
from tinycontext import load_config
from tinycontext.web import guard as guard_mod
from tinycontext.web.guard import BlockedURLError, Guard, GuardedTransport, classify, decide, parse_ipv4_legacy


def no_dns(host, port):
    raise AssertionError(f"resolver called for {host!r}")


@pytest.mark.parametrize("url, reason", [
    ("http://127.0.0.1/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://0177.0.0.1/", "loopback"),
    ("http://0x7f000001/", "loopback"),
    ("http://0x7f.1/", "loopback"),
    ("http://127.1/", "loopback"),
    ("http://127.0.0.1./", "loopback"),
    ("http://[::1]:8080/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://[::ffff:7f00:1]/", "loopback"),
    ("http://[::127.0.0.1]/", "loopback"),
    ("http://[2002:7f00:1::]/", "loopback"),
    ("http://localhost/", "loopback"),
    ("http://LOCALHOST./", "loopback"),
    ("http://localhost../x", "loopback"),
    ("http://api.localhost/", "loopback"),
    ("https://user:pw@localhost:8443/", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link_local"),
    ("http://0251.0376.0251.0376/", "link_local"),
    ("http://2852039166/", "link_local"),
    ("http://[::ffff:169.254.169.254]/", "link_local"),
    ("http://[::ffff:a9fe:a9fe]/", "link_local"),
    ("http://[fe80::1%25eth0]/", "link_local"),
    ("http://10.0.0.1/", "private"),
    ("http://172.16.5.4/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://0xc0a80101/", "private"),
    ("http://100.64.0.1/", "private"),
    ("http://[fd00::1]/", "private"),
    ("http://[64:ff9b::a00:1]/", "private"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://0/", "unspecified"),
    ("http://[::]/", "unspecified"),
])
def test_non_public_addresses_refused_in_every_notation(url, reason):
    decision = Guard(resolver=no_dns).decide(url)
    assert not decision.allowed
    assert decision.reason == reason, decision


@pytest.mark.parametrize("url, reason", [
    ("javascript:alert(1)", "scheme_not_allowed"),
    ("data:text/html,<script>alert(1)</script>", "scheme_not_allowed"),
    ("file:///etc/passwd", "scheme_not_allowed"),
    ("ftp://example.com/", "scheme_not_allowed"),
    ("gopher://127.0.0.1:25/", "scheme_not_allowed"),
    ("//example.com/path", "scheme_not_allowed"),
    ("example.com", "scheme_not_allowed"),
    ("", "invalid_url"),
    ("http://", "invalid_url"),
    ("http:///path", "invalid_url"),
    ("http://1.2.3.4.5/", "invalid_url"),
    ("http://256.0.0.1/", "invalid_url"),
    ("http://08.0.0.1/", "invalid_url"),
    ("http://example.com:99999/", "invalid_url"),
    ("http://[::1/", "invalid_url"),
])
def test_bad_urls_and_schemes_refused(url, reason):
    decision = Guard(resolver=no_dns).decide(url)
    assert not decision.allowed and decision.reason == reason, decision


def test_legacy_ipv4_parser_matches_browsers():
    assert str(parse_ipv4_legacy("127.1")) == "127.0.0.1"
    assert str(parse_ipv4_legacy("10.1.258")) == "10.1.1.2"
    assert str(parse_ipv4_legacy("0x7f.0.0.0x1")) == "127.0.0.1"
    assert str(parse_ipv4_legacy("8.8.8.8")) == "8.8.8.8"
    assert parse_ipv4_legacy("example.com") is None
    assert parse_ipv4_legacy("1.2.example") is None
    with pytest.raises(ValueError):
        parse_ipv4_legacy("1.2.3.0x1ffffffff")


def test_public_addresses_allowed_without_sending_anything():
    for address in ("93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"):
        assert classify(address) == "public"
    decision = Guard(resolver=no_dns).decide("https://8.8.8.8/dns")
    assert decision.allowed and decision.addresses == ("8.8.8.8",) and decision.port == 443


def test_names_are_resolved_and_every_address_must_be_public():
    calls = []

    def resolver(host, port):
        calls.append((host, port))
        return {"public.test": ["93.184.216.34"], "mixed.test": ["93.184.216.34", "10.0.0.7"],
                "intranet.test": ["192.168.0.10"], "meta.test": ["169.254.169.254"]}[host]

    guard = Guard(resolver=resolver)
    ok = guard.decide("https://Public.Test./a?b=1")
    assert ok.allowed and ok.addresses == ("93.184.216.34",)
    assert guard.decide("http://mixed.test/").reason == "private"
    assert guard.decide("http://intranet.test/").reason == "private"
    assert guard.decide("http://meta.test/").reason == "link_local"
    assert calls[0] == ("public.test", 443)


def test_unresolvable_and_resolver_errors_are_refusals():
    def fails(host, port):
        raise OSError("Name or service not known")

    decision = Guard(resolver=fails).decide("http://nowhere.test/")
    assert not decision.allowed and decision.reason == "unresolvable"
    assert Guard(resolver=lambda h, p: []).decide("http://empty.test/").reason == "unresolvable"
    assert Guard(resolver=lambda h, p: ["not-an-ip"]).decide("http://bad.test/").reason == "unresolvable"


def test_async_decision_matches_sync():
    guard = Guard(resolver=lambda h, p: ["10.1.1.1"])
    for url in ("http://x.test/", "http://0x7f000001/", "file:///etc/passwd", "https://8.8.4.4/"):
        assert asyncio.run(guard.adecide(url)) == guard.decide(url)


def test_allow_private_hosts_lets_everything_http_through():
    guard = Guard(allow_private_hosts=True, resolver=no_dns)
    assert guard.decide("http://127.1:9/").allowed
    assert guard.decide("http://169.254.169.254/").allowed
    assert not guard.decide("file:///etc/passwd").allowed
    assert decide("http://10.0.0.1/", allow_private_hosts=True).allowed


def test_allow_private_hosts_is_a_config_key_and_env_var():
    assert load_config(env={}).allow_private_hosts is False
    assert load_config(env={"TINYCONTEXT_ALLOW_PRIVATE_HOSTS": "true"}).allow_private_hosts is True


def get(guard: Guard, url: str, **kwargs) -> httpx.Response:
    async def run():
        async with httpx.AsyncClient(transport=GuardedTransport(guard), **kwargs) as client:
            return await client.get(url)
    return asyncio.run(run())


def page(h):
    send(h, 200, f"host={h.headers['Host']}".encode(), "text/plain")


@pytest.mark.parametrize("host", ["127.1", "0x7f000001", "2130706433", "[::ffff:127.0.0.1]", "localhost."])
def test_end_to_end_loopback_notations_refused_before_connecting(loopback_only, host):
    with LocalServer({"/": page}) as server:
        with pytest.raises(BlockedURLError) as info:
            get(Guard(), server.url("/", host))
        assert info.value.details["reason"] == "loopback"
        assert server.requests == []


def test_end_to_end_hosts_entry_naming_loopback_refused(loopback_only):
    with LocalServer({"/": page}) as server:
        guard = Guard(resolver=lambda host, port: ["127.0.0.1"] if host == "evil.test" else no_dns(host, port))
        with pytest.raises(BlockedURLError):
            get(guard, server.url("/", "evil.test"))
        assert server.requests == []


@pytest.mark.parametrize("host", ["127.1", "0x7f000001", "localhost"])
def test_allowed_notations_reach_the_local_server(loopback_only, host):
    with LocalServer({"/": page}) as server:
        response = get(Guard(allow_private_hosts=True), server.url("/", host))
        assert response.status_code == 200
        assert response.text == f"host={host}:{server.port}"


def test_transport_pins_the_checked_address_and_keeps_the_host_header(loopback_only):
    """The name is resolved once, by the guard; the connect goes to that address (no second lookup)."""
    lookups = []

    def resolver(host, port):
        lookups.append(host)
        return ["127.0.0.1"]

    with LocalServer({"/": page}) as server:
        response = get(Guard(allow_private_hosts=True, resolver=resolver), server.url("/", "site.test"))
        assert response.text == f"host=site.test:{server.port}"
        assert str(response.url) == server.url("/", "site.test")
    assert lookups == ["site.test"]


def test_the_fetcher_decides_each_hop_once(loopback_only):
    """HttpFetcher decides the first hop before sending (a refusal needs no connection) and hands that
    decision to the transport with the request: one lookup per hop, redirects still decided afresh."""
    from tinycontext import TinyContextConfig
    from tinycontext.web.fetch import HttpFetcher

    lookups = []

    def resolver(host, port):
        lookups.append(host)
        return ["127.0.0.1"]

    with LocalServer({"/": page}) as server:
        server.routes["/away"] = redirect(server.url("/", "other.test"))
        fetcher = HttpFetcher(TinyContextConfig(allow_private_hosts=True),
                              guard=Guard(allow_private_hosts=True, resolver=resolver))

        async def run():
            try:
                return await fetcher.fetch(server.url("/", "site.test")), await fetcher.fetch(server.url("/away", "site.test"))
            finally:
                await fetcher.aclose()

        direct, redirected = asyncio.run(run())
    assert direct.body == f"host=site.test:{server.port}".encode()
    assert redirected.body == f"host=other.test:{server.port}".encode()
    assert lookups == ["site.test", "site.test", "other.test"]


def test_every_redirect_hop_is_rechecked(loopback_only, monkeypatch):
    # Pretend 127.0.0.1 is public so a redirect to another notation of a non-public address is the only refusal.
    monkeypatch.setattr(guard_mod, "classify", lambda a: "public" if str(a) == "127.0.0.1" else classify(a))
    with LocalServer({"/ok": page}) as server:
        server.routes.update({
            "/to-ok": redirect("/ok"),
            "/to-mapped": redirect(f"http://[::ffff:127.0.0.1]:{server.port}/ok"),
            "/to-hex": redirect(f"http://0x7f000002:{server.port}/ok"),
            "/to-file": redirect("file:///etc/passwd"),
            "/to-metadata": redirect("http://169.254.169.254/latest/meta-data/"),
        })
        guard = Guard()
        assert get(guard, server.url("/to-ok"), follow_redirects=True).text == f"host=127.0.0.1:{server.port}"
        for path, reason in [("/to-mapped", "loopback"), ("/to-hex", "loopback"), ("/to-file", "scheme_not_allowed"),
                             ("/to-metadata", "link_local")]:
            with pytest.raises(BlockedURLError) as info:
                get(guard, server.url(path), follow_redirects=True)
            assert info.value.details["reason"] == reason, path
        assert [r["path"] for r in server.requests].count("/ok") == 1


# IANA's IPv4 and IPv6 Special-Purpose Address Registries (iana.org/assignments/iana-ipv4-special-registry,
# iana-ipv6-special-registry), each row as (block, globally reachable), plus deprecated and other blocks a
# guard must refuse. The guard decides from its own copy; this one checks it row by row.
IANA_SPECIAL = [
    ("0.0.0.0/8", False), ("0.0.0.0/32", False), ("10.0.0.0/8", False), ("100.64.0.0/10", False), ("127.0.0.0/8", False),
    ("169.254.0.0/16", False), ("172.16.0.0/12", False), ("192.0.0.0/24", False), ("192.0.0.0/29", False),
    ("192.0.0.8/32", False), ("192.0.0.9/32", True), ("192.0.0.10/32", True), ("192.0.0.170/32", False),
    ("192.0.0.171/32", False), ("192.0.2.0/24", False), ("192.31.196.0/24", True), ("192.52.193.0/24", True),
    ("192.88.99.0/24", False), ("192.168.0.0/16", False), ("192.175.48.0/24", True), ("198.18.0.0/15", False),
    ("198.51.100.0/24", False), ("203.0.113.0/24", False), ("240.0.0.0/4", False), ("255.255.255.255/32", False),
    ("::1/128", False), ("::/128", False), ("64:ff9b:1::/48", False), ("100::/64", False),
    ("100:0:0:1::/64", False), ("2001::/23", False), ("2001::/32", False), ("2001:1::1/128", True),
    ("2001:1::2/128", True), ("2001:1::3/128", True), ("2001:2::/48", False), ("2001:3::/32", True),
    ("2001:4:112::/48", True), ("2001:10::/28", False), ("2001:20::/28", True), ("2001:30::/28", True),
    ("2001:db8::/32", False), ("2002::/16", False), ("2620:4f:8000::/48", True), ("3fff::/20", False),
    ("5f00::/16", False), ("fc00::/7", False), ("fe80::/10", False),
    # (::ffff:0:0/96 and 64:ff9b::/96 carry an IPv4 address and are judged as that address: tested above.)
    # Not in the registries, never to be fetched: multicast, deprecated site-local.
    ("224.0.0.0/4", False), ("ff00::/8", False), ("fec0::/10", False),
]


def _samples(cidr: str):
    net = ipaddress.ip_network(cidr)
    return {net[0], net[-1], net[net.num_addresses // 2]}


@pytest.mark.parametrize("cidr, reachable", IANA_SPECIAL)
def test_classifier_follows_the_iana_special_purpose_tables(cidr, reachable):
    for address in _samples(cidr):
        kind = classify(address)
        assert (kind == "public") == reachable, (str(address), kind)


def test_classifier_refuses_the_addresses_the_review_found_and_keeps_public_ones():
    assert classify("192.0.0.8") != "public" and classify("fec0::1") != "public"
    for address in ("1.1.1.1", "9.9.9.9", "100.128.0.1", "192.0.1.1", "198.20.0.1", "2a00:1450:4001::1", "2600::1"):
        assert classify(address) == "public", address

"""The browser sends nothing the guard has not seen: no name lookup of its own, no UDP (WebRTC, QUIC),
no background request, whatever the page does. Real Chromium, launched exactly as the product
launches it, watched by the canaries of :mod:`browser_canary` (safe outside a network namespace)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

import browser_canary
from netguard import LocalServer, loopback_only, send  # noqa: F401 - fixture
from test_browser import needs_browser
from tinycontext import TinyContextConfig
from tinycontext.web.browser import BrowserService
from tinycontext.web.browser.launch import find_executable
from tinycontext.web.guard import Decision, Guard

# Today's Chromium started its own requests (component and extension updates, sign-in checks) about
# 8 s after launch when they were not stopped; the test watches the browser at least this long.
WATCH_S = 12


def _page(body: str) -> bytes:
    return f"<!doctype html><html><head><meta charset=utf-8><title>Canary</title></head><body>{body}</body></html>".encode()


def background_page(tcp: int) -> bytes:
    """Hints and forms that make a browser send things by itself, and a fetch the guard must refuse."""
    return _page(f"""<link rel=dns-prefetch href="//prefetch.canary.test"><link rel=preconnect href="https://preconnect.canary.test">
<h1>Canary page</h1>
<form><input name=user aria-label=User><input type=password name=pw aria-label=Password><button>Sign in</button></form>
<script>fetch('http://127.0.0.1:{tcp}/direct').catch(() => {{}});</script>""")


def webrtc_page(udp: int, tcp: int) -> bytes:
    """RTCPeerConnection (page and frame) with STUN and TURN servers at the canaries' loopback ports, and WebTransport."""
    ice = (f"[{{urls: 'stun:127.0.0.1:{udp}'}}, {{urls: 'turn:127.0.0.1:{udp}?transport=udp', username: 'u', credential: 'c'}},"
           f" {{urls: 'turn:127.0.0.1:{tcp}?transport=tcp', username: 'u', credential: 'c'}}]")
    return _page(f"""<h1>WebRTC page</h1><p id=rtc>rtc pending</p>
<script>
async function rtc(W) {{
  const pc = new W.RTCPeerConnection({{iceServers: {ice}}});
  pc.createDataChannel('x');
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise(done => {{ pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done();
                               setTimeout(done, 5000); }});
  return pc;
}}
const frame = document.createElement('iframe');
document.body.appendChild(frame);
Promise.all([rtc(window), rtc(frame.contentWindow)])
  .then(pcs => {{ window.pcs = pcs; document.getElementById('rtc').textContent = 'rtc gathered ' + pcs.length; }})
  .catch(e => {{ document.getElementById('rtc').textContent = 'rtc failed ' + e; }});
try {{ new WebTransport('https://127.0.0.1:{udp}/').ready.catch(() => {{}}); }} catch (e) {{}}
</script>""")


def only(site: LocalServer, **kwargs) -> Guard:
    """The product's guard (allow-private off), except that the test site's own origin is allowed."""
    origin = site.url("")

    class OnlyTheTestSite(Guard):
        async def adecide(self, url: str) -> Decision:
            if url.startswith(origin + "/"):
                return Decision(True, "ok", url, "127.0.0.1", site.port, ("127.0.0.1",))
            return await super().adecide(url)

    return OnlyTheTestSite(**kwargs)


@needs_browser
@pytest.mark.skipif(browser_canary.unavailable() is not None, reason=str(browser_canary.unavailable()))
def test_browser_resolves_no_name_and_sends_nothing_by_itself(loopback_only, tmp_path):
    """Every name the browser looks up itself reaches the DNS canary, every name the guard's proxy
    looks up reaches a recording resolver: neither hears of a host the page did not name, nothing
    reaches the TCP canary around the proxy, and the views note no request the page did not make."""
    asked: list[str] = []

    def recording_resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        raise OSError("the test resolves no name")

    with browser_canary.Canaries(tmp_path) as canaries, LocalServer({}) as site:
        site.routes["/"] = lambda h: send(h, 200, background_page(canaries.tcp_port))
        config = TinyContextConfig(memory_db_path=tmp_path / "m.db",
                                   browser_executable_path=canaries.wrap(find_executable(TinyContextConfig())))
        service = BrowserService(config, guard=only(site, resolver=recording_resolver))
        try:
            started = time.monotonic()
            view = service.call("navigate", "s", url=site.url("/"))
            assert "Canary page" in view["view"]
            password = next(line for line in view["view"].splitlines() if "Password" in line).rsplit("ref=", 1)[1]
            views = [view["view"], service.call("act", "s", action="type", ref=password, text="hunter2")["view"]]
            views.append(service.call("navigate", "s", url=site.url("/missing"))["view"])  # an error page
            time.sleep(max(0.0, WATCH_S - (time.monotonic() - started)))
            views.append(service.call("act", "s", action="look")["view"])
        finally:
            service.close()
        # Read after close: whatever the browser did until it exited counts.
        names, connections = list(canaries.names), canaries.connections
        assert names == [], f"the browser resolved names itself: {names}"
        assert connections == 0, "a connection reached the TCP canary around the guard's proxy"
        assert set(asked) <= {"preconnect.canary.test"}, asked  # the proxy: only what the page named
        notes = [line for text in views for line in text.splitlines() if line.startswith("(blocked")]
        assert notes and all(f"127.0.0.1:{canaries.tcp_port}" in n or "canary.test" in n for n in notes), notes

        # The canary itself: a lookup made through the same launcher is recorded.
        subprocess.run([str(canaries.wrap(Path(shutil.which("getent")))), "hosts", "canary-self-test.example"],
                       capture_output=True, timeout=30)
        assert "canary-self-test.example" in canaries.names


@needs_browser
@pytest.mark.skipif(not browser_canary.has_network_interface(),
                    reason="no network interface besides loopback: WebRTC would gather nothing to send")
def test_webrtc_and_webtransport_send_no_udp(loopback_only, tmp_path):
    """allow_private_hosts off; a page's WebRTC (STUN/TURN at loopback ports, in the page and in a
    frame) and WebTransport get no datagram and no connection through to the canaries."""
    with browser_canary.Canaries(tmp_path, dns=False) as canaries, LocalServer({}) as site:
        site.routes["/"] = lambda h: send(h, 200, webrtc_page(canaries.udp_port, canaries.tcp_port))
        service = BrowserService(TinyContextConfig(memory_db_path=tmp_path / "m.db"), guard=only(site))
        try:
            service.call("navigate", "s", url=site.url("/"))
            view = service.call("act", "s", action="wait_for", text="rtc gathered")["view"]
        finally:
            service.close()
        assert "rtc gathered 2" in view, view  # WebRTC ran in the page and in its frame
        assert canaries.datagrams == [], f"{len(canaries.datagrams)} UDP datagrams reached the loopback canary"
        assert canaries.connections == 0

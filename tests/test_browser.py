"""Browser tools against the real Chromium and pages served on 127.0.0.1 (nothing leaves loopback)."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import browser_pages
from netguard import loopback_only  # noqa: F401 - fixture
from tinycontext import TinyContextConfig
from tinycontext.errors import InvalidInputError
from tinycontext.web.browser import BrowserBusyError, BrowserService, close_services
from tinycontext.web.browser.launch import LAUNCH_ARGS, describe, find_executable, sandboxed
from tinycontext.web.browser.snapshot import build_tree, render
from tinycontext.web.guard import BlockedURLError, Decision, Guard

try:
    import playwright  # noqa: F401

    find_executable(TinyContextConfig())
    NO_BROWSER = None
except Exception as exc:  # noqa: BLE001
    NO_BROWSER = str(exc)
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=f"no browser: {NO_BROWSER}")


@pytest.fixture(scope="module")
def site():
    with browser_pages.server() as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    config = TinyContextConfig(allow_private_hosts=True, memory_db_path=tmp_path_factory.mktemp("b") / "m.db",
                               browser_max_sessions=16)
    service = BrowserService(config)
    yield service
    service.close()


def line_of(view: dict, text: str) -> str:
    return next(line for line in view["view"].splitlines() if text in line)


def ref_of(view: dict, text: str) -> str:
    return line_of(view, text).rsplit("ref=", 1)[1].split()[0].rstrip(":")


# -- the view, without a browser ---------------------------------------------------------------

def _ax(node_id, role, name="", children=(), backend=None, **props):
    return {"nodeId": str(node_id), "role": {"value": role}, "name": {"value": name}, "childIds": [str(c) for c in children],
            "backendDOMNodeId": backend, "properties": [{"name": k, "value": {"value": v}} for k, v in props.items()]}


AX = [
    _ax(1, "RootWebArea", "Shop", [2]),
    _ax(2, "generic", "", [3, 4, 7]),
    _ax(3, "heading", "Deals", [30], level=2),
    _ax(30, "StaticText", "Deals"),
    _ax(4, "list", "", [5, 6]),
    _ax(5, "listitem", "", [50], backend=50),
    _ax(50, "link", "Cheap kettle", [51], backend=51, focusable=True),
    _ax(51, "StaticText", "Cheap kettle"),
    _ax(6, "listitem", "", [60]),
    _ax(60, "StaticText", "Sold out: toaster (a+b)"),
    _ax(7, "form", "", [8, 9]),
    _ax(8, "textbox", "Email", [], backend=80, focusable=True, required=True),
    _ax(9, "checkbox", "Subscribe", [], backend=90, checked="true"),
]


def test_view_lines_refs_find_and_depth():
    root = build_tree(AX)
    refs = {}
    from tinycontext.web.browser.snapshot import assign_refs

    assign_refs(root, lambda backend: refs.setdefault(backend, f"e{len(refs) + 1}"))
    full = render(root)
    assert full.lines == [
        '- heading "Deals" [level=2]',
        "- list",
        '  - link "Cheap kettle" ref=e1',
        "  - listitem: Sold out: toaster (a+b)",
        "- form",
        '  - textbox "Email" [required] ref=e2',
        '  - checkbox "Subscribe" [checked] ref=e3',
    ]
    assert full.refs == ["e1", "e2", "e3"]
    # Same node, same ref: a second tree of the same page reuses them.
    again = build_tree(AX)
    assign_refs(again, lambda backend: refs.setdefault(backend, f"e{len(refs) + 1}"))
    assert render(again).lines == full.lines
    # find: matches with their ancestors; regex first, and an invalid regex is a literal substring.
    assert render(root, find="kettle").lines == ["- list", '  - link "Cheap kettle" ref=e1']
    assert render(root, find="EMAIL|subscribe").lines == ["- form", '  - textbox "Email" [required] ref=e2',
                                                         '  - checkbox "Subscribe" [checked] ref=e3']
    literal = render(root, find="(a+b")
    assert literal.matches == 1 and literal.lines == ["- list", "  - listitem: Sold out: toaster (a+b)"]
    assert render(root, find="nothing here").lines == []
    # depth: top level only, each cut branch says what it hides.
    assert render(root, depth=1).lines == ['- heading "Deals" [level=2]', "- list (+3 inside)", "- form (+2 inside)"]


# -- the real browser --------------------------------------------------------------------------

@needs_browser
def test_click_reveals_content(browser, site):
    before = len(site.requests)
    view = browser.call("navigate", "t-click", url=site.url("/click"))
    assert "Battery life" not in view["view"] and view["title"] == "Product"
    # Through the guard's proxy (one request per connection), not straight from Chromium.
    assert [r["headers"].get("Connection") for r in site.requests[before:] if r["path"] == "/click"] == ["close"]
    after = browser.call("act", "t-click", action="click", ref=ref_of(view, "Show details"))
    assert "Battery life: 42 hours" in after["view"]
    assert ref_of(after, "Show details") == ref_of(view, "Show details")  # refs are stable across views


@needs_browser
def test_cookie_banner_must_be_dismissed(browser, site):
    view = browser.call("navigate", "t-banner", url=site.url("/banner"))
    read = ref_of(view, "Read story")
    with pytest.raises(InvalidInputError, match='covered by .*Accept all|covered by dialog'):
        browser.call("act", "t-banner", action="click", ref=read)
    gone = browser.call("act", "t-banner", action="click", ref=ref_of(view, "Accept all"))
    assert "Cookie consent" not in gone["view"]
    story = browser.call("act", "t-banner", action="click", ref=read)
    assert "The bridge reopens on Monday." in story["view"]


@needs_browser
def test_search_form(browser, site):
    view = browser.call("navigate", "t-search", url=site.url("/search"))
    box = ref_of(view, "searchbox")
    typed = browser.call("act", "t-search", action="type", ref=box, text="tomato")
    assert '= "tomato"' in line_of(typed, "searchbox")
    found = browser.call("act", "t-search", action="press", ref=box, text="Enter")
    assert "Tomato soup" in found["view"] and "Tomato salad" in found["view"] and "Apple pie" not in found["view"]
    # Typing replaces the field's content.
    again = browser.call("act", "t-search", action="type", ref=box, text="pie")
    assert '= "pie"' in line_of(again, "searchbox")
    with pytest.raises(InvalidInputError, match="not a text field"):
        browser.call("act", "t-search", action="type", ref=ref_of(view, 'button "Search"'), text="x")
    with pytest.raises(InvalidInputError, match="Unknown key"):
        browser.call("act", "t-search", action="press", text="NoSuchKey")


@needs_browser
def test_second_tab(browser, site):
    view = browser.call("navigate", "t-tabs", url=site.url("/tabs"))
    clicked = browser.call("act", "t-tabs", action="click", ref=ref_of(view, "Open the manual"))
    assert clicked["tabs"] == 2 and "tab 2 opened" in clicked["view"] and clicked["tab"] == 1
    listing = browser.call("act", "t-tabs", action="tabs")
    assert "* tab 1: Home" in listing["view"] and "tab 2: Manual" in listing["view"]
    manual = browser.call("act", "t-tabs", action="switch_tab", text="2")
    assert manual["tab"] == 2 and "Chapter 1: Unpacking the widget." in manual["view"]
    with pytest.raises(InvalidInputError, match="belongs to tab 1"):
        browser.call("act", "t-tabs", action="click", ref=ref_of(view, "Open the manual"))
    back = browser.call("act", "t-tabs", action="close")
    assert back["tabs"] == 1 and back["tab"] == 1 and "Open the manual" in back["view"]
    closed = browser.call("act", "t-tabs", action="close")
    assert closed["closed"] and "t-tabs" not in browser.sessions
    with pytest.raises(InvalidInputError, match="browser_navigate first"):
        browser.call("act", "t-tabs", action="look")


@needs_browser
def test_infinite_scroll(browser, site):
    view = browser.call("navigate", "t-scroll", url=site.url("/scroll"), find="Post number")
    assert "Post number 40" in view["view"] and "Post number 41" not in view["view"]
    more = browser.call("act", "t-scroll", action="press", text="End", find="Post number")
    if "Post number 80" not in more["view"]:  # the fetch may still be on its way
        more = browser.call("act", "t-scroll", action="wait_for", text="Post number 80", find="Post number")
    assert "Post number 80" in more["view"]


@needs_browser
def test_refs_must_be_seen_and_current(browser, site):
    view = browser.call("navigate", "t-refs", url=site.url("/big"), max_tokens=300)
    assert view["truncated"] and "view cut at max_tokens=300" in view["view"]
    assert view["tokens"] <= 300 and view["structured_tokens"] <= 300
    unseen = f"e{max(int(r[1:]) for r in view['refs']) + 5}"
    with pytest.raises(InvalidInputError, match="not in a view you received"):
        browser.call("act", "t-refs", action="click", ref=unseen)
    with pytest.raises(InvalidInputError, match="not in a view"):
        browser.call("act", "t-refs", action="click", ref="#checkout")  # no CSS selectors
    old = view["refs"][0]
    browser.call("navigate", "t-refs", url=site.url("/click"))
    with pytest.raises(InvalidInputError, match="left"):
        browser.call("act", "t-refs", action="click", ref=old)


@needs_browser
def test_find_and_depth_shrink_a_large_page(browser, site):
    full = browser.call("navigate", "t-big", url=site.url("/big"), max_tokens=100_000)
    assert not full["truncated"] and full["tokens"] > 5000
    shallow = browser.call("act", "t-big", action="look", depth=2, max_tokens=100_000)
    assert shallow["tokens"] < 200 and "table (+" in shallow["view"]
    found = browser.call("act", "t-big", action="look", find=r"Item 42\b", max_tokens=100_000)
    assert found["matches"] == 1 and found["tokens"] < 100 and 'link "Item 42"' in found["view"]
    click = browser.call("act", "t-big", action="look", find="checkout")
    assert 'button "Checkout"' in click["view"]


@needs_browser
def test_private_addresses_are_blocked(site, loopback_only, tmp_path):
    """Only the test page's own origin is allowed; everything else on loopback is a private address
    the guard refuses, whatever notation or route the page uses (img, fetch, WebSocket, redirect)."""
    origin = site.url("")

    class OnlyTheTestSite(Guard):
        async def adecide(self, url: str) -> Decision:
            if url.startswith(origin + "/") or url == f"https://127.0.0.1:{site.port}/":
                return Decision(True, "ok", url, "127.0.0.1", site.port, ("127.0.0.1",))
            return await super().adecide(url)

    service = BrowserService(TinyContextConfig(memory_db_path=tmp_path / "m.db"), guard=OnlyTheTestSite())
    try:
        before = len(site.requests)
        view = service.call("navigate", "s", url=site.url("/sneaky"))
        assert "Harmless page" in view["view"]
        assert not [r for r in site.requests[before:] if r["path"].startswith("/secret")]
        assert "/hop" in {r["path"] for r in site.requests[before:]}  # the redirect was followed, its target refused
        blocked = [line for line in view["view"].splitlines() if line.startswith("(blocked")]
        assert any("127.0.0.4" in line for line in blocked), view["view"]  # the redirect hop
        assert any("127.0.0.2" in line for line in blocked) and all("loopback" in line for line in blocked)
        assert any("127.0.0.3" in line for line in blocked)  # the WebSocket, tunnelled with CONNECT
        for url in (f"http://127.0.0.2:{site.port}/secret", f"http://2130706434:{site.port}/", "file:///etc/passwd",
                    f"http://[::1]:{site.port}/"):
            with pytest.raises(BlockedURLError):
                service.call("navigate", "s", url=url)
        # A top-level redirect to a refused address is a blocked error, not the proxy's refusal page.
        for path, target in (("/hop", "127.0.0.4"), ("/hop-tls", "127.0.0.5")):
            for method in ("navigate", "render_html"):
                with pytest.raises(BlockedURLError, match=target) as refused:
                    service.call(method, "r", url=site.url(path))
                assert refused.value.details["reason"] == "loopback"
    finally:
        service.close()
    assert not [r for r in site.requests if r["path"].startswith("/secret")]


@needs_browser
def test_session_limit_wait_and_idle_close(site, tmp_path):
    config = TinyContextConfig(allow_private_hosts=True, memory_db_path=tmp_path / "m.db", browser_max_sessions=1,
                               browser_session_wait_seconds=0.5, browser_idle_seconds=1.5)
    service = BrowserService(config)
    try:
        service.call("navigate", "a", url=site.url("/click"))
        started = time.monotonic()
        with pytest.raises(BrowserBusyError, match="browser_max_sessions"):
            service.call("navigate", "b", url=site.url("/click"))
        assert time.monotonic() - started >= 0.5
        time.sleep(1.6)  # a's session is now idle past browser_idle_seconds
        view = service.call("navigate", "b", url=site.url("/click"))
        assert "Widget 3000" in view["view"] and set(service.sessions) == {"b"}
    finally:
        service.close()


@needs_browser
def test_two_mcp_clients_never_share_tabs_or_cookies(site, tmp_path):
    from tinycontext import close_engines
    from tinycontext.servers.http import ServeSettings, background, mcp_app

    config = TinyContextConfig(allow_private_hosts=True, memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models",
                               tools="browser")

    async def client(url: str, who: str, out: dict):
        async with httpx.AsyncClient(timeout=60) as http, streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                out["tools"] = {t.name for t in (await session.list_tools()).tools}
                await session.call_tool("browser_navigate", {"url": site.url(f"/set_cookie?who={who}")})
                if who == "alice":
                    await session.call_tool("browser_navigate", {"url": site.url("/tabs")})
                    view = await session.call_tool("browser_navigate", {"url": site.url("/tabs")})
                    link = ref_of({"view": view.content[0].text}, "Open the manual")
                    await session.call_tool("browser_act", {"action": "click", "ref": link})
                out["cookie"] = (await session.call_tool("browser_navigate", {"url": site.url("/show_cookie")})).content[0].text
                tabs = await session.call_tool("browser_act", {"action": "tabs"})
                out["tabs"] = tabs.content[0].text
                out["count"] = tabs.structuredContent["tabs"]
                bad = await session.call_tool("browser_act", {"action": "click", "ref": "e999"})
                out["bad"] = (bad.isError, bad.content[0].text)

    async def both(url: str):
        alice, bob = {}, {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(client, url, "alice", alice)
            tg.start_soon(client, url, "bob", bob)
        return alice, bob

    try:
        with background(mcp_app(ServeSettings(), config)) as base:
            alice, bob = anyio.run(both, base + "/mcp")
    finally:
        close_services()
        close_engines()
    assert {"browser_navigate", "browser_act"} <= alice["tools"]
    assert "Cookie: who=alice" in alice["cookie"] and "Cookie: who=bob" in bob["cookie"]
    assert alice["count"] == 2 and bob["count"] == 1
    assert "Manual" in alice["tabs"] and "Manual" not in bob["tabs"]
    assert alice["bad"][0] and alice["bad"][1].startswith("invalid_input:")


def test_backend_off_removes_the_tools(tmp_path):
    from tinycontext.servers.fastapi_server import create_app
    from tinycontext.servers.http import ServeSettings
    from tinycontext.servers.mcp_server import build_server

    off = TinyContextConfig(memory_db_path=tmp_path / "m.db", browser_backend="off", tools="all")
    on = off.model_copy(update={"browser_backend": "chromium"})
    names = lambda config: {t.name for t in anyio.run(build_server(config).list_tools)}  # noqa: E731
    assert {"browser_navigate", "browser_act"} <= names(on)
    assert not {"browser_navigate", "browser_act"} & names(off)
    paths = lambda config: set(create_app(config, settings=ServeSettings()).openapi()["paths"])  # noqa: E731
    assert {"/browser/navigate", "/browser/act"} <= paths(on)
    assert not {"/browser/navigate", "/browser/act"} & paths(off)
    assert describe(off)[1] == {"backend": "off"}


@needs_browser
def test_rest_endpoints(site, tmp_path):
    from tinycontext.servers.fastapi_server import create_app
    from tinycontext.servers.http import ServeSettings, background

    config = TinyContextConfig(allow_private_hosts=True, memory_db_path=tmp_path / "m.db")
    try:
        with background(create_app(config, settings=ServeSettings())) as base, httpx.Client(base_url=base, timeout=60) as api:
            view = api.post("/browser/navigate", json={"url": site.url("/click"), "session_id": "r"}).json()
            assert "Widget 3000" in view["view"] and view["refs"]
            after = api.post("/browser/act", json={"action": "click", "ref": view["refs"][0], "session_id": "r"}).json()
            assert "Battery life" in after["view"]
            other = api.post("/browser/act", json={"action": "look", "session_id": "someone-else"})
            assert other.status_code == 400 and other.json()["code"] == "invalid_input"
            blocked = api.post("/browser/navigate", json={"url": "ftp://example.test/"})
            assert blocked.status_code == 403 and blocked.json()["code"] == "blocked"
            bad = api.post("/browser/act", json={"action": "evaluate", "text": "alert(1)"})
            assert bad.status_code == 422
    finally:
        close_services()


@needs_browser
def test_doctor_names_the_browser():
    summary, details = describe(TinyContextConfig())
    assert details["executable"] == str(find_executable(TinyContextConfig())) and "Chromium" in summary
    cdp = describe(TinyContextConfig(browser_cdp_url="ws://127.0.0.1:9/devtools"))
    assert cdp[1]["cdp_url"] == "ws://127.0.0.1:9/devtools"


@needs_browser
def test_external_browser_over_cdp(site, tmp_path):
    """A browser someone else started (here: Chromium on a loopback DevTools port) is driven the same
    way, and its pages still reach the network only through the guard's proxy."""
    import re
    import subprocess

    chromium = subprocess.Popen(
        [str(find_executable(TinyContextConfig())), "--headless", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}", *(["--no-sandbox"] if not sandboxed() else []),
         *LAUNCH_ARGS, "about:blank"],
        stderr=subprocess.PIPE, text=True)
    try:
        for line in chromium.stderr:
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                break
        else:
            pytest.fail("Chromium did not print its DevTools address")
        config = TinyContextConfig(allow_private_hosts=True, memory_db_path=tmp_path / "m.db", browser_cdp_url=found.group(1))
        assert describe(config)[1]["cdp_url"] == found.group(1)
        service = BrowserService(config)
        try:
            before = len(site.requests)
            view = service.call("navigate", "c", url=site.url("/click"))
            after = service.call("act", "c", action="click", ref=ref_of(view, "Show details"))
            assert "Battery life: 42 hours" in after["view"]
            page_requests = [r for r in site.requests[before:] if r["path"] == "/click"]
            # The guard's proxy forwards one request per connection; a direct request would keep the connection alive.
            assert page_requests and all(r["headers"].get("Connection") == "close" for r in page_requests)
        finally:
            service.close()
    finally:
        chromium.terminate()
        chromium.wait(10)


def test_without_playwright_the_tools_say_which_extra(monkeypatch, tmp_path):
    import sys

    from tinycontext.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "playwright.async_api", None)  # as if the extra were not installed
    service = BrowserService(TinyContextConfig(allow_private_hosts=True, memory_db_path=tmp_path / "m.db"))
    try:
        with pytest.raises(MissingExtraError, match=r"tinycontext\[browser\]"):
            service.call("navigate", "x", url="http://127.0.0.1:9/")
        assert not service.sessions
    finally:
        service.close()

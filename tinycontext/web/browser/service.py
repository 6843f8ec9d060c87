"""Browser sessions: one isolated browser context (cookies, storage, tabs) per client, driven through refs.

:class:`BrowserService` owns the Playwright driver and the browser on a thread of its own with its
own event loop (Playwright objects belong to the loop that made them), so MCP handlers (async) and
REST endpoints (worker threads) call it the same way: :meth:`BrowserService.call` and
:meth:`BrowserService.acall`. At most ``browser_max_sessions`` sessions live at once; a session
unused for ``browser_idle_seconds`` closes, and a new client waits ``browser_session_wait_seconds``
for a free one before a ``browser_busy`` error.

Every context sends its traffic through its own :class:`GuardProxy`, so whatever a page loads
passes the SSRF guard. The agent acts only through refs of views it has received: a click is a
real mouse click at the element's centre (refused when something else covers it), typing is real
key presses into the focused field; no selector, script or file path from the agent ever reaches
the page.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ... import telemetry
from ...budget.tokens import TokenCounter
from ...config import TinyContextConfig
from ...errors import InvalidInputError, TinyContextError
from ...budget.render import MIN_AGENT_TOKENS, to_json
from ..guard import BlockedURLError, Decision, Guard
from . import launch
from ..proxies import proxies_for
from .proxy import BLOCK_HEADER, GuardProxy, RefuseAll
from .snapshot import REF_RE, Node, assign_refs, build_tree, fit_lines, render, walk

log = logging.getLogger(__name__)

ACTIONS = ("look", "click", "type", "press", "wait_for", "tabs", "switch_tab", "close")
NEEDS_REF = {"click", "type"}
MAX_TEXT_CHARS = 10_000
SETTLE_S = 2.0  # longest wait for the page to go quiet after an action
LINK_WAIT_S = 1.0  # longest wait for a clicked link to open a tab or start loading
MAX_EVENTS = 20


class BrowserError(TinyContextError):
    """The browser could not do what was asked (page error, crash, timeout); the message says what."""

    code = "browser_error"


class BrowserBusyError(TinyContextError):
    """Every browser session is taken (``browser_max_sessions``)."""

    code = "browser_busy"


@dataclass
class Ref:
    tab: int
    generation: int  # the tab's document when the ref was made: a ref never outlives its page
    backend_id: int
    editable: bool
    label: str


@dataclass
class Tab:
    id: int
    page: Any
    cdp: Any = None
    generation: int = 0
    inflight: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Session:
    key: str
    context: Any = None
    proxy: GuardProxy | None = None
    tabs: dict[int, Tab] = field(default_factory=dict)
    current: int | None = None
    next_tab: int = 1
    refs: dict[str, Ref] = field(default_factory=dict)
    by_node: dict[tuple[int, int, int], str] = field(default_factory=dict)
    next_ref: int = 1
    seen: set[str] = field(default_factory=set)
    events: list[str] = field(default_factory=list)
    refused: list[Decision] = field(default_factory=list)  # the guard's refusals since the last navigate
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False

    def note(self, event: str) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        elif len(self.events) == MAX_EVENTS:
            self.events.append("(more events left out)")


class BrowserService:
    def __init__(self, config: TinyContextConfig, *, guard: Guard | None = None):
        self.config = config
        self.guard = guard or Guard(allow_private_hosts=config.allow_private_hosts)
        self.counter = TokenCounter(config.encoding_name)
        self.sessions: dict[str, Session] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run_loop, name="tinycontext-browser", daemon=True)
        self.thread.start()
        self._playwright = None
        self._browser = None
        self._sink: GuardProxy | None = None
        # The browser's own requests that its browser-wide proxy refused (none is expected; tests check).
        self.background: list[str] = []
        self._browser_lock: asyncio.Lock | None = None
        self._slots: asyncio.Condition | None = None
        self._reaper: asyncio.Task | None = None
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _submit(self, coro) -> concurrent.futures.Future:
        if self._closed:
            coro.close()
            raise BrowserError("The browser service is closed.")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, method: str, key: str, **kwargs) -> dict:
        """Run ``method`` (navigate, act, close_session) for client ``key`` and wait for it (any thread)."""
        with _operation(method, kwargs) as op:
            return _viewed(op, self._submit(getattr(self, method)(key, **kwargs)).result())

    async def acall(self, method: str, key: str, **kwargs) -> dict:
        with _operation(method, kwargs) as op:
            return _viewed(op, await asyncio.wrap_future(self._submit(getattr(self, method)(key, **kwargs))))

    def close_later(self, key: str) -> None:
        """Close ``key``'s session soon, without waiting (safe from finalizers on any thread)."""
        if not self._closed:
            asyncio.run_coroutine_threadsafe(self.close_session(key), self.loop)

    def close(self) -> None:
        """Close every session and the browser, then stop the loop thread."""
        if self._closed:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(60)
        except Exception:  # noqa: BLE001 - closing must not raise at exit
            log.warning("browser shutdown failed", exc_info=True)
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _shutdown(self) -> None:
        if self._reaper:
            self._reaper.cancel()
        for session in list(self.sessions.values()):
            await self._close_session(session)
        if self._browser is not None:
            try:
                await self._browser.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self._playwright is not None:
            await self._playwright.stop()
        if self._sink is not None:
            await self._sink.close()
        self._browser = self._playwright = self._sink = None

    # -- browser and sessions -------------------------------------------------------------------

    async def _ensure_browser(self):
        if self._browser_lock is None:
            self._browser_lock = asyncio.Lock()
        async with self._browser_lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            if self._playwright is None:
                self._playwright = await launch.require_playwright()().start()
            chromium = self._playwright.chromium
            try:
                if self.config.browser_cdp_url:
                    self._browser = await chromium.connect_over_cdp(self.config.browser_cdp_url,
                                                                    timeout=self.config.browser_timeout_seconds * 1000)
                else:
                    if self._sink is None:
                        self._sink = GuardProxy(RefuseAll(), self._background)
                        await self._sink.start()
                    # Contexts get their own guarded proxies; everything else the browser sends goes here.
                    self._browser = await chromium.launch(
                        executable_path=str(launch.find_executable(self.config)), args=launch.LAUNCH_ARGS,
                        proxy={"server": self._sink.url, "bypass": "<-loopback>"},
                        chromium_sandbox=launch.sandboxed(), timeout=self.config.browser_timeout_seconds * 1000)
            except TinyContextError:
                raise
            except Exception as exc:  # noqa: BLE001 - Playwright reports launch failures as plain errors
                where = self.config.browser_cdp_url or "the local Chromium"
                raise BrowserError(f"Cannot start the browser ({where}): {_first_line(exc)}. Run `tinycontext doctor`.") from exc
            self._browser.on("disconnected", self._browser_gone)
            return self._browser

    def _background(self, decision: Decision) -> None:
        if len(self.background) < MAX_EVENTS:
            self.background.append(decision.url)
        log.debug("refused the browser's own request to %s", decision.url)

    def _browser_gone(self, _browser=None) -> None:
        # Contexts die with the browser: forget them so the next call starts afresh.
        self._browser = None
        for session in list(self.sessions.values()):
            session.closed = True
        self.sessions.clear()
        if self._slots is not None:
            asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._slots:
            self._slots.notify_all()

    async def _session(self, key: str, *, create: bool) -> Session | None:
        if self._slots is None:
            self._slots = asyncio.Condition()
            self._reaper = asyncio.ensure_future(self._reap())
        await self._close_idle()
        session = self.sessions.get(key)
        if session is not None or not create:
            return session
        async with self._slots:
            deadline = time.monotonic() + self.config.browser_session_wait_seconds
            while key not in self.sessions and len(self.sessions) >= self.config.browser_max_sessions:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BrowserBusyError(
                        f"All {self.config.browser_max_sessions} browser sessions are in use (browser_max_sessions); "
                        f"waited {self.config.browser_session_wait_seconds:g} s. Try again later; a session frees up when "
                        "its client closes it (browser_act close) or after browser_idle_seconds unused.")
                try:
                    await asyncio.wait_for(self._slots.wait(), remaining)
                except asyncio.TimeoutError:
                    continue
            if key in self.sessions:
                return self.sessions[key]
            session = self.sessions[key] = Session(key)  # holds the slot while it opens
        try:
            await self._open(session)
        except BaseException:
            self.sessions.pop(key, None)
            await self._notify()
            raise
        return session

    async def _open(self, session: Session) -> None:
        browser = await self._ensure_browser()
        # One upstream proxy (proxy_server) per session, taken in turn; proxy_bypass still decides per request.
        session.proxy = GuardProxy(self.guard, lambda decision: self._blocked(session, decision), proxies_for(self.config).sticky())
        await session.proxy.start()
        try:
            # Service workers would fetch outside page routing; downloads and permissions stay off.
            session.context = await browser.new_context(
                proxy={"server": session.proxy.url, "bypass": "<-loopback>"}, service_workers="block",
                accept_downloads=False, viewport={"width": 1280, "height": 900}, locale="en-US")
        except Exception:
            await session.proxy.close()
            raise
        session.context.set_default_timeout(self.config.browser_timeout_seconds * 1000)
        # Pages the site opens (target=_blank, window.open) become tabs; the session's first page is ours.
        session.context.on("page", lambda page: asyncio.ensure_future(self._adopt(session, page, opened=bool(session.tabs))))

    def _blocked(self, session: Session, decision: Decision) -> None:
        if len(session.refused) < MAX_EVENTS:
            session.refused.append(decision)
        session.note(f"blocked a request to {decision.url.removesuffix('/')} ({decision.reason}: the SSRF guard refuses it)")

    async def _adopt(self, session: Session, page, *, opened: bool = False) -> Tab:
        for tab in session.tabs.values():
            if tab.page is page:
                await tab.ready.wait()
                return tab
        tab = Tab(session.next_tab, page)
        session.next_tab += 1
        session.tabs[tab.id] = tab
        if session.current is None:
            session.current = tab.id
        page.on("dialog", lambda dialog: asyncio.ensure_future(self._dialog(session, tab, dialog)))
        page.on("close", lambda _page: self._tab_closed(session, tab))
        page.on("request", lambda _r: _bump(tab, 1))
        page.on("requestfinished", lambda _r: _bump(tab, -1))
        page.on("requestfailed", lambda _r: _bump(tab, -1))
        page.on("filechooser", lambda _chooser: session.note(f"tab {tab.id}: a file chooser opened; uploads are not supported"))
        try:
            tab.cdp = await session.context.new_cdp_session(page)
            tab.cdp.on("Page.frameNavigated", lambda event: _navigated(tab, event))
            await tab.cdp.send("Page.enable")
            await tab.cdp.send("DOM.enable")
            await tab.cdp.send("Accessibility.enable")
        except Exception:
            self._tab_closed(session, tab)  # e.g. a popup that closed itself at once
            raise
        finally:
            tab.ready.set()
        if opened:
            session.note(f"tab {tab.id} opened: switch_tab {tab.id} to use it")
        return tab

    async def _dialog(self, session: Session, tab: Tab, dialog) -> None:
        session.note(f"tab {tab.id}: dismissed a {dialog.type} dialog: {' '.join(dialog.message.split())[:200]!r}")
        try:
            await dialog.dismiss()
        except Exception:  # noqa: BLE001 - the page may be gone already
            pass

    def _tab_closed(self, session: Session, tab: Tab) -> None:
        session.tabs.pop(tab.id, None)
        if session.current == tab.id:
            session.current = max(session.tabs) if session.tabs else None

    async def _close_session(self, session: Session) -> None:
        self.sessions.pop(session.key, None)
        session.closed = True
        try:
            if session.context is not None:
                await session.context.close()
        except Exception:  # noqa: BLE001 - the browser may have gone first
            pass
        if session.proxy is not None:
            await session.proxy.close()
        if self._slots is not None:
            await self._notify()

    async def _close_idle(self) -> None:
        limit = time.monotonic() - self.config.browser_idle_seconds
        for session in list(self.sessions.values()):
            if session.last_used < limit and not session.lock.locked() and session.context is not None:
                await self._close_session(session)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(self.config.browser_idle_seconds / 4, 30))
            await self._close_idle()

    # -- the two tools --------------------------------------------------------------------------

    async def navigate(self, key: str, *, url: str, find: str | None = None, depth: int | None = None,
                       max_tokens: int | None = None) -> dict:
        _check_view_args(find, depth, max_tokens)
        decision = await self.guard.adecide(url)
        if not decision.allowed:
            raise decision.error()
        session = await self._session(key, create=True)
        async with session.lock:
            session.last_used = time.monotonic()
            tab = session.tabs.get(session.current) if session.current else None
            if tab is None:
                tab = await self._adopt(session, await session.context.new_page())
                session.current = tab.id
            session.refused.clear()
            try:
                _raise_if_refused(session, await tab.page.goto(url, wait_until="load"))
            except TinyContextError:
                raise
            except Exception as exc:  # noqa: BLE001 - Playwright errors carry net:: codes and timeouts
                if "Timeout" not in type(exc).__name__:
                    _raise_if_refused(session, None, exc)
                    raise BrowserError(f"Cannot open {url}: {_first_line(exc)}" + _block_hint(session)) from exc
                session.note(f"the page did not finish loading within {self.config.browser_timeout_seconds:g} s")
            await _settle(tab)
            return await self._view(session, find=find, depth=depth, max_tokens=max_tokens)

    async def act(self, key: str, *, action: str, ref: str | None = None, text: str | None = None,
                  find: str | None = None, depth: int | None = None, max_tokens: int | None = None) -> dict:
        if action not in ACTIONS:
            raise InvalidInputError(f"Unknown action {action!r}; use one of: {', '.join(ACTIONS)}.")
        _check_view_args(find, depth, max_tokens)
        if text is not None and len(text) > MAX_TEXT_CHARS:
            raise InvalidInputError(f"text is longer than {MAX_TEXT_CHARS} characters.")
        session = await self._session(key, create=False)
        if session is None or not session.tabs:
            raise InvalidInputError("No page is open in this session: call browser_navigate first.")
        async with session.lock:
            session.last_used = time.monotonic()
            if action == "tabs":
                return await self._tabs(session)
            if action == "close":
                return await self._close_tab(session, text, find=find, depth=depth, max_tokens=max_tokens)
            if action == "switch_tab":
                number = _tab_number(text)
                if number not in session.tabs:
                    raise InvalidInputError(f"There is no tab {number}; open tabs: {', '.join(map(str, session.tabs))}.")
                session.current = number
                await session.tabs[number].page.bring_to_front()
            else:
                tab = session.tabs[session.current]
                await self._do(session, tab, action, ref, text)
                await _settle(tab)
            return await self._view(session, find=find, depth=depth, max_tokens=max_tokens)

    async def render_html(self, key: str, *, url: str) -> dict:
        """Load ``url`` in a throw-away session (it counts toward browser_max_sessions) and return
        the document as scripts left it: ``{url, final_url, status, html, timed_out, blocked}``."""
        decision = await self.guard.adecide(url)
        if not decision.allowed:
            raise decision.error()
        session = await self._session(key, create=True)
        try:
            async with session.lock:
                tab = await self._adopt(session, await session.context.new_page())
                timed_out = False
                try:
                    response = await tab.page.goto(url, wait_until="load")
                    _raise_if_refused(session, response)
                except TinyContextError:
                    raise
                except Exception as exc:  # noqa: BLE001 - Playwright errors carry net:: codes and timeouts
                    if "Timeout" not in type(exc).__name__:
                        _raise_if_refused(session, None, exc)
                        raise BrowserError(f"Cannot open {url}: {_first_line(exc)}" + _block_hint(session)) from exc
                    response, timed_out = None, True
                await _settle(tab)
                return {"url": url, "final_url": tab.page.url, "status": response.status if response else None,
                        "html": await tab.page.content(), "timed_out": timed_out,
                        "blocked": [e for e in session.events if e.startswith("blocked")]}
        finally:
            await self._close_session(session)

    async def close_session(self, key: str) -> dict:
        session = self.sessions.get(key)
        if session is not None:
            async with session.lock:
                await self._close_session(session)
        return {"closed": session is not None}

    async def _do(self, session: Session, tab: Tab, action: str, ref: str | None, text: str | None) -> None:
        page = tab.page
        if action in NEEDS_REF and not ref:
            raise InvalidInputError(f"{action} needs ref: a ref=… from the latest view.")
        if action == "type" and text is None:
            raise InvalidInputError("type needs text.")
        if action == "press" and not text:
            raise InvalidInputError("press needs text: a key such as Enter, Tab, Escape, End, PageDown, ArrowDown.")
        target = self._resolve(session, tab, ref) if ref else None
        try:
            if action == "click":
                x, y = await self._point(tab, target, ref)
                tabs, generation = len(session.tabs), tab.generation
                await page.mouse.click(x, y)
                if target.label.startswith("link"):
                    await _link_followed(session, tab, tabs, generation)
            elif action == "type":
                if not target.editable:
                    raise InvalidInputError(f"ref {ref} ({target.label}) is not a text field; type needs a textbox, "
                                            "searchbox or combobox ref.")
                await tab.cdp.send("DOM.focus", {"backendNodeId": target.backend_id})
                await page.keyboard.press("ControlOrMeta+A")
                await page.keyboard.press("Delete")
                await page.keyboard.type(text)
            elif action == "press":
                if target is not None:
                    await tab.cdp.send("DOM.focus", {"backendNodeId": target.backend_id})
                await page.keyboard.press(text)
            elif action == "wait_for":
                await self._wait_for(session, tab, text)
        except TinyContextError:
            raise
        except Exception as exc:  # noqa: BLE001 - Playwright and CDP errors become typed errors
            message = _first_line(exc)
            if "Unknown key" in message:
                raise InvalidInputError(f"press: {message}") from exc
            if "No node" in message or "Could not find node" in message:
                raise InvalidInputError(f"ref {ref} is no longer on the page; use a ref from a new view (look).") from exc
            raise BrowserError(f"{action} failed: {message}") from exc

    async def _wait_for(self, session: Session, tab: Tab, text: str | None) -> None:
        timeout = self.config.browser_timeout_seconds
        try:
            if text:
                await tab.page.get_by_text(text).first.wait_for(state="visible", timeout=timeout * 1000)
            else:
                await tab.page.wait_for_load_state("networkidle", timeout=timeout * 1000)
        except Exception as exc:  # noqa: BLE001 - a timeout is an answer, not a failure
            if "Timeout" not in type(exc).__name__:
                raise
            what = f"{text!r} did not appear" if text else "the page did not go quiet"
            session.note(f"wait_for: {what} within {timeout:g} s")

    def _resolve(self, session: Session, tab: Tab, ref: str) -> Ref:
        ref = ref.strip().removeprefix("ref=")
        target = session.refs.get(ref)
        if target is None or ref not in session.seen:
            raise InvalidInputError(f"ref {ref} is not in a view you received; use a ref=… shown by the latest view "
                                    "(call look, with find to search the page).")
        if target.tab != tab.id:
            raise InvalidInputError(f"ref {ref} belongs to tab {target.tab}; switch_tab {target.tab} first.")
        if target.generation != tab.generation:
            raise InvalidInputError(f"ref {ref} belonged to a page this tab has left; use a ref from a new view (look).")
        return target

    async def _point(self, tab: Tab, target: Ref, ref: str) -> tuple[float, float]:
        """The viewport point to click: the element's centre, scrolled into view and not covered."""
        node = {"backendNodeId": target.backend_id}
        await tab.cdp.send("DOM.scrollIntoViewIfNeeded", node)
        quads = (await tab.cdp.send("DOM.getContentQuads", node)).get("quads") or []
        viewport = tab.page.viewport_size or {"width": 1280, "height": 900}
        for quad in quads:
            xs, ys = quad[0::2], quad[1::2]
            x = min(max(sum(xs) / 4, 0), viewport["width"] - 1)
            y = min(max(sum(ys) / 4, 0), viewport["height"] - 1)
            if max(xs) - min(xs) >= 1 and max(ys) - min(ys) >= 1:
                break
        else:
            raise InvalidInputError(f"ref {ref} ({target.label}) is not visible, so it cannot be clicked.")
        hit = await tab.cdp.send("DOM.getNodeForLocation", {"x": int(x), "y": int(y), "includeUserAgentShadowDOM": True})
        inside = await tab.cdp.send("DOM.describeNode", {**node, "depth": -1, "pierce": True})
        if hit.get("backendNodeId") not in set(_backend_ids(inside["node"])):
            cover = await _describe_ax(tab, hit.get("backendNodeId"))
            raise InvalidInputError(f"ref {ref} ({target.label}) is covered by {cover}; deal with that first "
                                    "(e.g. dismiss a banner or dialog), then look again.")
        return x, y

    async def _tabs(self, session: Session) -> dict:
        lines = [f"{'*' if tid == session.current else ' '} tab {tid}: {await _title_url(tab.page)}" for tid, tab in session.tabs.items()]
        text = "\n".join([f"{len(session.tabs)} tab(s); * = current. switch_tab N to change.", *lines])
        return self._answer({"tab": session.current, "tabs": len(session.tabs), "truncated": False, "refs": []}, text)

    async def _close_tab(self, session: Session, text: str | None, **view_args) -> dict:
        number = _tab_number(text) if text else session.current
        tab = session.tabs.get(number)
        if tab is None:
            raise InvalidInputError(f"There is no tab {number}; open tabs: {', '.join(map(str, session.tabs))}.")
        if len(session.tabs) == 1:
            await self._close_session(session)
            text = "Closed the last tab: the browser session (cookies, storage) is gone. browser_navigate starts a new one."
            return self._answer({"tab": None, "tabs": 0, "truncated": False, "refs": [], "closed": True}, text)
        await tab.page.close()
        self._tab_closed(session, tab)
        return await self._view(session, **view_args)

    # -- the view -------------------------------------------------------------------------------

    async def _view(self, session: Session, *, find: str | None, depth: int | None, max_tokens: int | None) -> dict:
        max_tokens = max_tokens or self.config.browser_max_tokens
        session.last_used = time.monotonic()  # idle time counts from the end of the last call
        tab = session.tabs[session.current]
        try:
            ax = await tab.cdp.send("Accessibility.getFullAXTree")
        except Exception as exc:  # noqa: BLE001 - e.g. the page navigated while we read it
            raise BrowserError(f"Cannot read the page: {_first_line(exc)}. Try look again.") from exc
        root = build_tree(ax.get("nodes", []))
        assign_refs(root, lambda backend_id: self._ref_for(session, tab, backend_id))
        self._remember(session, root)
        view = render(root, find=find, depth=depth)
        header = [f"Tab {tab.id} of {len(session.tabs)}: {await _title_url(tab.page)}", *[f"({e})" for e in session.events]]
        session.events.clear()
        if find and not view.matches:
            header.append(f"(nothing matches find={find!r}; the page has {sum(1 for _ in walk(root)) - 1} nodes)")
        elif not view.lines:
            header.append("(the page shows nothing an accessibility tree can describe yet; try wait_for)")
        header_text = "\n".join(header)
        budget = max_tokens - self.counter.count(header_text) - 40  # 40: room for the cut notice
        if budget <= 0:
            raise InvalidInputError(f"max_tokens={max_tokens} is too small for this view's header; raise it.")
        counts = self.counter.count_many(view.lines)
        lines, cut = fit_lines(view.lines, counts, budget)
        if cut:
            lines.append(f"(view cut at max_tokens={max_tokens}: {cut} more lines; narrow it with find or depth)")
        text = header_text + ("\n" + "\n".join(lines) if lines else "")
        refs = [m for line in lines for m in REF_RE.findall(line)]
        session.seen.update(refs)
        return self._answer({"tab": tab.id, "tabs": len(session.tabs), "url": tab.page.url, "title": await _title(tab.page),
                             "truncated": bool(cut), "refs": refs, **({"matches": view.matches} if find else {})}, text)

    def _answer(self, facts: dict, text: str) -> dict:
        """The view text and the facts around it, each counted as the agent receives it (text, JSON)."""
        facts["tokens"] = self.counter.count(text)
        facts["structured_tokens"] = 0
        facts["structured_tokens"] = self.counter.count(to_json(facts))
        return {**facts, "view": text}

    def _ref_for(self, session: Session, tab: Tab, backend_id: int) -> str:
        key = (tab.id, tab.generation, backend_id)
        ref = session.by_node.get(key)
        if ref is None:
            ref = session.by_node[key] = f"e{session.next_ref}"
            session.next_ref += 1
        return ref

    def _remember(self, session: Session, root: Node) -> None:
        tab = session.tabs[session.current]
        for node in walk(root):
            if node.ref:
                session.refs[node.ref] = Ref(tab.id, tab.generation, node.backend_id,
                                             node.role in _EDITABLE_ROLES or "editable" in node.states, node.label())


_EDITABLE_ROLES = frozenset({"textbox", "searchbox", "combobox", "spinbutton"})


def _bump(tab: Tab, delta: int) -> None:
    tab.inflight = max(0, tab.inflight + delta)


def _navigated(tab: Tab, event: dict) -> None:
    # A new document in the main frame: its DOM node ids mean other nodes now.
    if not event.get("frame", {}).get("parentId"):
        tab.generation += 1


async def _link_followed(session: Session, tab: Tab, tabs: int, generation: int) -> None:
    """Give a clicked link a moment to show what it does: a new tab (its page event arrives after the
    click returns), a request or a new document in this tab."""
    deadline = time.monotonic() + LINK_WAIT_S
    while time.monotonic() < deadline:
        if len(session.tabs) > tabs or tab.inflight or tab.generation != generation:
            break
        await asyncio.sleep(0.05)
    for other in list(session.tabs.values()):
        try:
            await asyncio.wait_for(other.ready.wait(), SETTLE_S)
        except asyncio.TimeoutError:
            pass


async def _settle(tab: Tab) -> None:
    """Wait (briefly) for what an action started: a navigation, requests, rendering."""
    deadline = time.monotonic() + SETTLE_S
    await asyncio.sleep(0.05)
    quiet = 0
    while time.monotonic() < deadline and quiet < 3:
        quiet = quiet + 1 if tab.inflight == 0 else 0
        await asyncio.sleep(0.05)
    try:
        await tab.page.wait_for_load_state("domcontentloaded", timeout=max(0.1, deadline - time.monotonic()) * 1000)
    except Exception:  # noqa: BLE001 - a slow page is read as it is
        pass


def _backend_ids(node: dict):
    yield node.get("backendNodeId")
    for key in ("children", "shadowRoots", "pseudoElements"):
        for child in node.get(key, []) or []:
            yield from _backend_ids(child)
    if node.get("contentDocument"):
        yield from _backend_ids(node["contentDocument"])


async def _describe_ax(tab: Tab, backend_id: int | None) -> str:
    """``role "name"`` of the element at a point (or its nearest named ancestor), for messages."""
    if backend_id is None:
        return "another element"
    try:
        nodes = (await tab.cdp.send("Accessibility.getPartialAXTree", {"backendNodeId": backend_id, "fetchRelatives": True}))["nodes"]
    except Exception:  # noqa: BLE001 - a best-effort description
        return "another element"
    for node in reversed(nodes):
        name = (node.get("name") or {}).get("value")
        role = (node.get("role") or {}).get("value")
        if name and role not in ("RootWebArea", "StaticText"):
            return f'{role} "{" ".join(str(name).split())[:80]}"'
    return "another element"


async def _title_url(page) -> str:
    title = " ".join((await _title(page)).split())[:120]
    return f"{title} — {page.url}" if title else page.url


async def _title(page) -> str:
    try:
        return await page.title()
    except Exception:  # noqa: BLE001 - navigating
        return ""


def _tab_number(text: str | None) -> int:
    try:
        return int(str(text).strip().removeprefix("tab").strip())
    except ValueError:
        raise InvalidInputError(f"Give the tab number as text (e.g. text='2'), not {text!r}.") from None


def _check_view_args(find: str | None, depth: int | None, max_tokens: int | None) -> None:
    if depth is not None and depth < 1:
        raise InvalidInputError("depth must be 1 or more.")
    if max_tokens is not None and not MIN_AGENT_TOKENS <= max_tokens <= 1_000_000:
        raise InvalidInputError(f"max_tokens must be between {MIN_AGENT_TOKENS} and 1000000.")
    if find is not None and not find.strip():
        raise InvalidInputError("find must not be empty.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _raise_if_refused(session: Session, response, error: Exception | None = None) -> None:
    """A navigation that ended on the guard's refusal (a redirect to a refused address: the proxy's
    403 for http, a refused CONNECT for https) is a ``blocked`` error, not a page."""
    if response is not None and BLOCK_HEADER.lower() in response.headers:
        raise BlockedURLError(f"{response.url!r} refused: a redirect led to an address the SSRF guard refuses "
                              f"({response.headers[BLOCK_HEADER.lower()]})",
                              reason=response.headers[BLOCK_HEADER.lower()], url=response.url)
    if error is not None and "ERR_TUNNEL_CONNECTION_FAILED" in str(error) and session.refused:
        raise session.refused[0].error()


def _block_hint(session: Session) -> str:
    blocked = [e for e in session.events if e.startswith("blocked")]
    return f" ({blocked[0]})" if blocked else ""


_services: dict[TinyContextConfig, BrowserService] = {}
_services_lock = threading.Lock()


def _operation(method: str, kwargs: dict):
    """The span of one browser call: the method and, for act, the action when it is one of ACTIONS (never a
    URL, ref, text or the caller's key)."""
    action = kwargs.get("action") if method == "act" else method
    return telemetry.operation("browser", action=action if action in (*ACTIONS, "navigate", "render_html", "close_session") else "other")


def _viewed(op: telemetry.Operation, answer: dict) -> dict:
    if isinstance(answer, dict) and isinstance(answer.get("tokens"), int):
        op.set(tokens=answer["tokens"])
    return answer


def get_service(config: TinyContextConfig) -> BrowserService:
    """The process's browser service for ``config`` (started on first use, closed at exit)."""
    with _services_lock:
        service = _services.get(config)
        if service is None:
            service = _services[config] = BrowserService(config)
        return service


def close_services() -> None:
    with _services_lock:
        services = list(_services.values())
        _services.clear()
    for service in services:
        service.close()


atexit.register(close_services)

"""Browser sessions: one isolated browser context (cookies, storage, tabs) per client, driven through refs.

:class:`BrowserService` owns the Playwright driver and the browser on a thread of its own with its
own event loop (Playwright objects belong to the loop that made them), so MCP handlers (async) and
REST endpoints (worker threads) call it the same way: :meth:`BrowserService.call` and
:meth:`BrowserService.acall`. At most ``browser_max_sessions`` sessions live at once; a session
unused for ``browser_idle_seconds`` closes, and a new client waits ``browser_session_wait_seconds``
for a free one before a ``browser_busy`` error.

Every context sends its traffic through its own :class:`GuardProxy`, so whatever a page loads
passes the SSRF guard. The agent acts only through refs of views it has received (a session's
tabs and refs: :mod:`.session`; clicks, typing and waits on a tab: :mod:`.page`); no selector,
script or file path from the agent ever reaches the page.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import time

from ... import telemetry
from ...budget.tokens import TokenCounter
from ...config import TinyContextConfig
from ...errors import InvalidInputError, TinyContextError
from ...budget.render import to_json
from ..guard import Decision, Guard
from . import launch
from ..proxies import proxies_for
from .page import act_on, bump, check_view_args, first_line, goto, navigated, page_title, settle, tab_number, title_and_url
from .proxy import GuardProxy, RefuseAll
from .session import MAX_EVENTS, BrowserBusyError, BrowserError, Session, Tab
from .snapshot import REF_RE, assign_refs, build_tree, fit_lines, render, walk

log = logging.getLogger(__name__)

ACTIONS = ("look", "click", "type", "press", "wait_for", "tabs", "switch_tab", "close")
MAX_TEXT_CHARS = 10_000


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
                raise BrowserError(f"Cannot start the browser ({where}): {first_line(exc)}. Run `tinycontext doctor`.") from exc
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
        page.on("request", lambda _r: bump(tab, 1))
        page.on("requestfinished", lambda _r: bump(tab, -1))
        page.on("requestfailed", lambda _r: bump(tab, -1))
        page.on("filechooser", lambda _chooser: session.note(f"tab {tab.id}: a file chooser opened; uploads are not supported"))
        try:
            tab.cdp = await session.context.new_cdp_session(page)
            tab.cdp.on("Page.frameNavigated", lambda event: navigated(tab, event))
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
        check_view_args(find, depth, max_tokens)
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
            if (await goto(session, tab, url))[1]:
                session.note(f"the page did not finish loading within {self.config.browser_timeout_seconds:g} s")
            await settle(tab)
            return await self._view(session, find=find, depth=depth, max_tokens=max_tokens)

    async def act(self, key: str, *, action: str, ref: str | None = None, text: str | None = None,
                  find: str | None = None, depth: int | None = None, max_tokens: int | None = None) -> dict:
        if action not in ACTIONS:
            raise InvalidInputError(f"Unknown action {action!r}; use one of: {', '.join(ACTIONS)}.")
        check_view_args(find, depth, max_tokens)
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
                number = tab_number(text)
                if number not in session.tabs:
                    raise InvalidInputError(f"There is no tab {number}; open tabs: {', '.join(map(str, session.tabs))}.")
                session.current = number
                await session.tabs[number].page.bring_to_front()
            else:
                tab = session.tabs[session.current]
                await act_on(session, tab, action, ref, text, self.config.browser_timeout_seconds)
                await settle(tab)
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
                response, timed_out = await goto(session, tab, url)
                await settle(tab)
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

    async def _tabs(self, session: Session) -> dict:
        lines = [f"{'*' if tid == session.current else ' '} tab {tid}: {await title_and_url(tab.page)}" for tid, tab in session.tabs.items()]
        text = "\n".join([f"{len(session.tabs)} tab(s); * = current. switch_tab N to change.", *lines])
        return self._answer({"tab": session.current, "tabs": len(session.tabs), "truncated": False, "refs": []}, text)

    async def _close_tab(self, session: Session, text: str | None, **view_args) -> dict:
        number = tab_number(text) if text else session.current
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
            raise BrowserError(f"Cannot read the page: {first_line(exc)}. Try look again.") from exc
        root = build_tree(ax.get("nodes", []))
        assign_refs(root, lambda backend_id: session.ref_for(tab, backend_id))
        session.remember(root)
        view = render(root, find=find, depth=depth)
        header = [f"Tab {tab.id} of {len(session.tabs)}: {await title_and_url(tab.page)}", *[f"({e})" for e in session.events]]
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
        return self._answer({"tab": tab.id, "tabs": len(session.tabs), "url": tab.page.url, "title": await page_title(tab.page),
                             "truncated": bool(cut), "refs": refs, **({"matches": view.matches} if find else {})}, text)

    def _answer(self, facts: dict, text: str) -> dict:
        """The view text and the facts around it, each counted as the agent receives it (text, JSON)."""
        facts["tokens"] = self.counter.count(text)
        facts["structured_tokens"] = 0
        facts["structured_tokens"] = self.counter.count(to_json(facts))
        return {**facts, "view": text}

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

"""Acting on a tab: real clicks and key presses through refs, waiting for a page to settle, and
the small readings (title, tab numbers, refusals) the service's answers are made of.

A click lands at the element's centre only when nothing covers it there; typing focuses the field
by its DOM node and presses real keys; no selector or script from the agent reaches the page.
"""

from __future__ import annotations

import asyncio
import time

from ...budget.render import MIN_AGENT_TOKENS
from ...errors import InvalidInputError, TinyContextError
from ..guard import BlockedURLError
from .proxy import BLOCK_HEADER
from .session import BrowserError, Ref, Session, Tab

NEEDS_REF = {"click", "type"}
SETTLE_S = 2.0  # longest wait for the page to go quiet after an action
LINK_WAIT_S = 1.0  # longest wait for a clicked link to open a tab or start loading


async def act_on(session: Session, tab: Tab, action: str, ref: str | None, text: str | None, timeout: float) -> None:
    """Do one action on ``tab``: a real click at a ref's centre, key presses into a field, a wait."""
    page = tab.page
    if action in NEEDS_REF and not ref:
        raise InvalidInputError(f"{action} needs ref: a ref=… from the latest view.")
    if action == "type" and text is None:
        raise InvalidInputError("type needs text.")
    if action == "press" and not text:
        raise InvalidInputError("press needs text: a key such as Enter, Tab, Escape, End, PageDown, ArrowDown.")
    target = resolve(session, tab, ref) if ref else None
    try:
        if action == "click":
            x, y = await point(tab, target, ref)
            tabs, generation = len(session.tabs), tab.generation
            await page.mouse.click(x, y)
            if target.label.startswith("link"):
                await link_followed(session, tab, tabs, generation)
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
            await wait_for(session, tab, text, timeout)
    except TinyContextError:
        raise
    except Exception as exc:  # noqa: BLE001 - Playwright and CDP errors become typed errors
        message = first_line(exc)
        if "Unknown key" in message:
            raise InvalidInputError(f"press: {message}") from exc
        if "No node" in message or "Could not find node" in message:
            raise InvalidInputError(f"ref {ref} is no longer on the page; use a ref from a new view (look).") from exc
        raise BrowserError(f"{action} failed: {message}") from exc

async def wait_for(session: Session, tab: Tab, text: str | None, timeout: float) -> None:
    """Wait until ``text`` shows (or the page goes quiet); a timeout is noted, not raised."""
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

def resolve(session: Session, tab: Tab, ref: str) -> Ref:
    """The node a ref from a view the agent received names, in this tab's current document."""
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

async def point(tab: Tab, target: Ref, ref: str) -> tuple[float, float]:
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
    if hit.get("backendNodeId") not in set(backend_ids(inside["node"])):
        cover = await describe_ax(tab, hit.get("backendNodeId"))
        raise InvalidInputError(f"ref {ref} ({target.label}) is covered by {cover}; deal with that first "
                                "(e.g. dismiss a banner or dialog), then look again.")
    return x, y


def bump(tab: Tab, delta: int) -> None:
    tab.inflight = max(0, tab.inflight + delta)


def navigated(tab: Tab, event: dict) -> None:
    # A new document in the main frame: its DOM node ids mean other nodes now.
    if not event.get("frame", {}).get("parentId"):
        tab.generation += 1


async def link_followed(session: Session, tab: Tab, tabs: int, generation: int) -> None:
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


async def settle(tab: Tab) -> None:
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


def backend_ids(node: dict):
    yield node.get("backendNodeId")
    for key in ("children", "shadowRoots", "pseudoElements"):
        for child in node.get(key, []) or []:
            yield from backend_ids(child)
    if node.get("contentDocument"):
        yield from backend_ids(node["contentDocument"])


async def describe_ax(tab: Tab, backend_id: int | None) -> str:
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


async def title_and_url(page) -> str:
    title = " ".join((await page_title(page)).split())[:120]
    return f"{title} — {page.url}" if title else page.url


async def page_title(page) -> str:
    try:
        return await page.title()
    except Exception:  # noqa: BLE001 - navigating
        return ""


def tab_number(text: str | None) -> int:
    try:
        return int(str(text).strip().removeprefix("tab").strip())
    except ValueError:
        raise InvalidInputError(f"Give the tab number as text (e.g. text='2'), not {text!r}.") from None


def check_view_args(find: str | None, depth: int | None, max_tokens: int | None) -> None:
    if depth is not None and depth < 1:
        raise InvalidInputError("depth must be 1 or more.")
    if max_tokens is not None and not MIN_AGENT_TOKENS <= max_tokens <= 1_000_000:
        raise InvalidInputError(f"max_tokens must be between {MIN_AGENT_TOKENS} and 1000000.")
    if find is not None and not find.strip():
        raise InvalidInputError("find must not be empty.")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def raise_if_refused(session: Session, response, error: Exception | None = None) -> None:
    """A navigation that ended on the guard's refusal (a redirect to a refused address: the proxy's
    403 for http, a refused CONNECT for https) is a ``blocked`` error, not a page."""
    if response is not None and BLOCK_HEADER.lower() in response.headers:
        raise BlockedURLError(f"{response.url!r} refused: a redirect led to an address the SSRF guard refuses "
                              f"({response.headers[BLOCK_HEADER.lower()]})",
                              reason=response.headers[BLOCK_HEADER.lower()], url=response.url)
    if error is not None and "ERR_TUNNEL_CONNECTION_FAILED" in str(error) and session.refused:
        raise session.refused[0].error()


async def goto(session: Session, tab: Tab, url: str):
    """Load ``url`` in ``tab``: (the response, whether the load timed out). A guard refusal is a
    ``blocked`` error and any other failure a :class:`BrowserError`; a page still loading at the
    timeout is kept (partial pages are still read)."""
    try:
        response = await tab.page.goto(url, wait_until="load")
        raise_if_refused(session, response)
        return response, False
    except TinyContextError:
        raise
    except Exception as exc:  # noqa: BLE001 - Playwright errors carry net:: codes and timeouts
        if "Timeout" not in type(exc).__name__:
            raise_if_refused(session, None, exc)
            raise BrowserError(f"Cannot open {url}: {first_line(exc)}" + block_hint(session)) from exc
        return None, True


def block_hint(session: Session) -> str:
    blocked = [e for e in session.events if e.startswith("blocked")]
    return f" ({blocked[0]})" if blocked else ""

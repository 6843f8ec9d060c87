"""A browser session's state: its tabs, the refs of the views it was shown, and what happened since.

A ref names one node of one tab's document at one generation (the document it was made for), so
an action can never reach a node of a page the tab has left; :meth:`Session.ref_for` gives the same
node the same ref across views.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import TinyContextError
from ..guard import Decision
from .proxy import GuardProxy
from .snapshot import Node, walk

MAX_EVENTS = 20
EDITABLE_ROLES = frozenset({"textbox", "searchbox", "combobox", "spinbutton"})


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

    def ref_for(self, tab: Tab, backend_id: int) -> str:
        """The ref of a node of ``tab``'s current document (the same node keeps its ref)."""
        key = (tab.id, tab.generation, backend_id)
        ref = self.by_node.get(key)
        if ref is None:
            ref = self.by_node[key] = f"e{self.next_ref}"
            self.next_ref += 1
        return ref

    def remember(self, root: Node) -> None:
        """Keep the refs of a view, so that actions can find their nodes."""
        tab = self.tabs[self.current]
        for node in walk(root):
            if node.ref:
                self.refs[node.ref] = Ref(tab.id, tab.generation, node.backend_id,
                                             node.role in EDITABLE_ROLES or "editable" in node.states, node.label())

"""What an agent receives: memories rendered as text and as structured content, within a token budget.

Every interface (MCP, REST, CLI) hands an agent two things that cost context: the text it reads and
the structured content (JSON) it may parse. :func:`fit_page` chooses, in rank order, the items whose
rendering keeps BOTH the joined text and the compact JSON within ``max_tokens`` (counted with the
configured encoding), so the budget holds where it matters. It is generic: recall, listings and
web results give it their own line renderer, item builder and frames.

One renderer for a memory line (:func:`memory_line`) and one for a single memory
(:func:`memory_block`) serve the CLI and the MCP server alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .tokens import TokenCounter
from ..retrieval.conversation import display_text
from ..errors import InvalidInputError, RecallBudgetError

Detail = Literal["compact", "full"]
DETAILS: tuple[str, ...] = ("compact", "full")
# The smallest budget an interface accepts: the answer that says "nothing fits, raise it to N" must fit too.
MIN_AGENT_TOKENS = 64
CONVERSATION_FIELDS = ("occurred_at", "speaker", "attachments", "episode")
# How many items to render and count at a time while filling a page.
_CHUNK = 32

T = TypeVar("T")


def to_json(value: Any) -> str:
    """The JSON an interface sends (compact, UTF-8): what the structured-content budget counts."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def plural(count: int, singular: str, many: str | None = None) -> str:
    """``1 memory``, ``2 memories``, ``1 token``: a count with its noun in the right number."""
    return f"{count} {singular if count == 1 else many or singular + 's'}"


def one_line(text: str) -> str:
    return " ".join(text.split())


def check_detail(detail: str) -> Detail:
    if detail not in DETAILS:
        raise InvalidInputError(f"detail must be one of {', '.join(DETAILS)}, got {detail!r}.")
    return detail  # type: ignore[return-value]


def check_agent_budget(max_tokens: Any) -> int:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not MIN_AGENT_TOKENS <= max_tokens <= 1_000_000:
        raise RecallBudgetError(f"max_tokens must be an integer from {MIN_AGENT_TOKENS} to 1000000 (the answer itself "
                                f"needs room), got {max_tokens!r}.")
    return max_tokens


# -- one memory ---------------------------------------------------------------------------------


def memory_date(memory: dict) -> str:
    """When it happened if the memory says so, else when it was last written."""
    return (memory.get("occurred_at") or memory.get("updated_at") or memory.get("created_at") or "")[:10]


def memory_text(memory: dict) -> str:
    """The content as a reader needs it: ``Speaker: content [shares caption]`` for a turn."""
    return one_line(display_text(memory["content"], memory.get("speaker"), memory.get("attachments") or ()))


def memory_line(memory: dict, *, detail: Detail = "compact", with_session: bool = False) -> str:
    """``- content (YYYY-MM-DD; tags: a, b; id 12)``: one memory on one line for a model to read.
    ``full`` adds the session, version and metadata."""
    facts = [memory_date(memory)] if memory_date(memory) else []
    if memory.get("tags"):
        facts.append("tags: " + ", ".join(memory["tags"]))
    if with_session or detail == "full":
        facts.append(f"session {memory['session_id']}")
    facts.append(f"id {memory['id']}")
    if memory.get("superseded_by"):  # an outdated fact, shown only when asked for: say so, cheaply
        facts.append(f"superseded by {memory['superseded_by']}")
    if detail == "full":
        facts.append(f"v{memory['version']}")
        if memory.get("metadata"):
            facts.append("metadata " + to_json(memory["metadata"]))
    return f"- {memory_text(memory)} ({'; '.join(facts)})"


def memory_item(memory: dict, *, detail: Detail = "compact") -> dict:
    """Structured content for one memory: compact = what an agent needs to act on it."""
    if detail == "full":
        # Conversation fields a memory does not use are left out rather than sent as nulls.
        item = {k: v for k, v in memory.items() if k not in CONVERSATION_FIELDS or v not in (None, [])}
        if item.get("scores"):  # four decimals order memories as well as seventeen, for a quarter of the tokens
            item["scores"] = {k: None if v is None else round(v, 4) for k, v in item["scores"].items()}
        return item
    item = {"id": memory["id"]}
    if "rank" in memory:
        item["rank"] = memory["rank"]
    item["content"] = memory["content"]
    for key in ("speaker", "attachments"):
        if memory.get(key):
            item[key] = memory[key]
    if memory.get("tags"):
        item["tags"] = memory["tags"]
    if memory_date(memory):
        item["date"] = memory_date(memory)
    if memory.get("superseded_by"):
        item["superseded_by"] = memory["superseded_by"]
    return item


def memory_block(memory: dict) -> str:
    """One memory with its metadata and edit history (get/update answers)."""
    lines = [memory_line(memory, detail="full")]
    for old in memory.get("history", []):
        lines.append(f"v{old['version']} until {old['superseded_at'][:10]}: {one_line(old['content'])}")
    return "\n".join(lines)


# -- fitting a page -----------------------------------------------------------------------------


@dataclass
class Page:
    """A page of items as handed to an agent. ``chosen``/``skipped`` are positions in the ranked
    input; ``next_position`` is where the next page starts (None: nothing left); ``needed`` is set
    when items existed but none fit: the smallest ``max_tokens`` that shows the first one."""

    max_tokens: int
    chosen: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    next_position: int | None = None
    needed: int | None = None
    text: str = ""
    structured: dict = field(default_factory=dict)
    text_tokens: int = 0
    structured_tokens: int = 0

    @property
    def tokens(self) -> int:
        return max(self.text_tokens, self.structured_tokens)

    @property
    def truncated(self) -> bool:
        """The budget (not the item limit) left something out."""
        return bool(self.skipped) or self.needed is not None


TextFrame = Callable[[list[str], Page], str]
StructuredFrame = Callable[[list[dict], Page], dict]


def fit_page(items: Sequence[T], *, max_tokens: int, counter: TokenCounter, line: Callable[[T], str],
             item: Callable[[T], dict], text_frame: TextFrame, structured_frame: StructuredFrame,
             limit: int | None = None) -> Page:
    """Choose items in rank order (at most ``limit``) so that ``text_frame(lines)`` and
    ``to_json(structured_frame(items))`` both count at most ``max_tokens``.

    An item that does not fit is skipped and filling continues, so one long item never hides
    shorter ones after it; skipped items after the last chosen one are left for the next page. The
    frames see the page (chosen, skipped, next position, ``text_tokens`` when building the
    structured frame) so headers, footers and envelopes are counted too. Filling uses per-item
    counts; the final answer is counted whole and shrunk until it fits.
    """
    lines: list[str] = []
    objects: list[dict] = []
    line_tokens: list[int] = []
    item_tokens: list[int] = []

    def ensure(position: int) -> None:
        while len(lines) <= position:
            batch = items[len(lines):len(lines) + _CHUNK]
            new_lines = [line(x) for x in batch]
            new_objects = [item(x) for x in batch]
            lines.extend(new_lines)
            objects.extend(new_objects)
            line_tokens.extend(counter.count_many(new_lines))
            item_tokens.extend(counter.count_many([to_json(o) for o in new_objects]))

    def render(chosen: list[int], skipped: list[int], next_position: int | None, needed: int | None = None) -> Page:
        page = Page(max_tokens, list(chosen), list(skipped), next_position, needed)
        page.text = text_frame([lines[p] for p in chosen], page)
        page.text_tokens = counter.count(page.text)
        page.structured = structured_frame([objects[p] for p in chosen], page)
        page.structured_tokens = counter.count(to_json(page.structured))
        return page

    def select(budget: int) -> tuple[list[int], list[int], int | None]:
        empty = render([], [], None)
        used_text, used_json = empty.text_tokens, empty.structured_tokens
        chosen: list[int] = []
        skipped: list[int] = []
        for position in range(len(items)):
            if limit is not None and len(chosen) >= limit:
                return chosen, skipped, position
            ensure(position)
            # +1: the newline / comma joining this item to the others.
            cost_text, cost_json = line_tokens[position] + 1, item_tokens[position] + 1
            if used_text + cost_text <= budget and used_json + cost_json <= budget:
                chosen.append(position)
                used_text += cost_text
                used_json += cost_json
            else:
                skipped.append(position)
        return chosen, skipped, None

    def settle(chosen: list[int], skipped: list[int], stop: int | None) -> tuple[list[int], int | None]:
        """Skipped items after the last chosen one belong to the next page."""
        if not chosen:
            return skipped, stop
        after = chosen[-1] + 1
        return [p for p in skipped if p < after], stop if stop is not None else (after if after < len(items) else None)

    chosen, skipped, stop = select(max_tokens)
    while chosen:
        kept_skipped, next_position = settle(chosen, skipped, stop)
        page = render(chosen, kept_skipped, next_position)
        if page.tokens <= max_tokens:
            return page
        # The whole answer counts more than its parts (frames, joins): give back the last item.
        stop = chosen.pop()
        skipped = [p for p in skipped if p < stop]
    if not items:
        return render([], [], None)
    # Nothing fits: say what would. The page that shows only the first item, as filling would build it.
    ensure(0)
    first = render([0], [], 1 if len(items) > 1 else None)
    empty = render([], [], None)
    estimate = max(empty.text_tokens + line_tokens[0] + 1, empty.structured_tokens + item_tokens[0] + 1)
    return render([], [], None, needed=max(first.tokens, estimate))


# -- recall ---------------------------------------------------------------------------------------


def recall_page(memories: Sequence[dict], *, max_tokens: int, counter: TokenCounter, limit: int, offset: int = 0,
                detail: Detail = "compact", session_id: str | None = None, extra: dict | None = None,
                sessions: Iterable[str] | None = None) -> Page:
    """A recall answer: ranked memories (with ``rank``) fitted to ``max_tokens`` as text and structured
    content. ``extra`` (small, fixed-size facts such as the relevance floor) joins the envelope.
    ``sessions``: the memories' sessions, when known without reading every memory."""
    detail = check_detail(detail)
    # Name sessions only when an unfiltered recall may return memories from more than one.
    names = {m["session_id"] for m in memories} if sessions is None else set(sessions)
    with_session = session_id is None and len(names) > 1

    def next_offset(page: Page) -> int | None:
        return None if page.next_position is None else offset + page.next_position

    def text(lines: list[str], page: Page) -> str:
        if page.needed is not None:
            return f"Nothing fits max_tokens={page.max_tokens}: the best match needs max_tokens={page.needed}."
        if not lines and not page.skipped:
            return "No matching memories."
        out = list(lines)
        if page.skipped:
            out.append(f"({len(page.skipped)} more matched but did not fit max_tokens={page.max_tokens}.)")
        if page.next_position is not None:
            out.append(f"(More: call again with offset={next_offset(page)}.)")
        return "\n".join(out)

    def structured(items: list[dict], page: Page) -> dict:
        out: dict[str, Any] = {"memories": items, "total_tokens": page.text_tokens, "max_tokens": page.max_tokens,
                               "truncated": page.truncated or (page.next_position is not None and len(items) < limit),
                               "next_offset": next_offset(page)}
        if page.skipped:
            out["omitted"] = len(page.skipped)
        if page.needed is not None:
            out["needed_tokens"] = page.needed
        if extra:
            out.update(extra)
        return out

    return fit_page(memories, max_tokens=max_tokens, counter=counter, limit=limit,
                    line=lambda m: memory_line(m, detail=detail, with_session=with_session),
                    item=lambda m: memory_item(m, detail=detail), text_frame=text, structured_frame=structured)

"""Web answers as the agent receives them: text and structured content, both within max_tokens.

Counted with the renderer recall uses (:mod:`tinycontext.render`: the configured encoding, compact
JSON, frames included). A page's units (paragraphs, list items, table rows) are chosen whole, best
first; one that does not fit is skipped and the budget is filled with the next best that do, never
with cut text. Chosen neighbours of one section are shown as one window of original text. Framing is
small: a heading path is named once, where it changes (less a first heading that begins the page's
title: the header names it), and a window that does not follow the one before it starts with ``[…]``.
The structured content gives each window as ``{text, start}``: ``start`` is its character offset in the
extracted page (its end is ``start + len(text)``, so not sent); headings are framed in the text only, which
is where they cost least (the structured content is what binds at every budget: JSON escapes and keys).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..budget.tokens import TokenCounter, fit_budget
from ..errors import RecallBudgetError
from ..budget.render import Page, one_line, to_json

if TYPE_CHECKING:
    from .chunk import Chunk
    from .pages import PageResult


def interleave(pages: Sequence[PageResult]) -> list[tuple[int, Chunk]]:
    """(page index, chunk): every page's best passage, then every page's second best, and so on."""
    columns = [[(i, c) for c in page.chunks] for i, page in enumerate(pages)]
    return [pair for row in itertools.zip_longest(*columns) for pair in row if pair is not None]


def _link_line(url: str, text: str) -> str:
    return f"- {one_line(text)} <{url}>"


def _pick_links(pages: Sequence[PageResult], budget: int, counter: TokenCounter) -> list[list[dict]]:
    """Each ok page's best links (ranked against its query) within an equal share of ``budget``."""
    with_links = [p for p in pages if p.outcome == "ok" and p.links]
    share = budget // len(with_links) if with_links else 0
    picked: list[list[dict]] = []
    for page in pages:
        if page.outcome != "ok" or not page.links or share <= 0:
            picked.append([])
            continue
        candidates = page.links[:50]
        # A link costs its line and its JSON object; count the larger.
        costs = [max(a, b) + 1 for a, b in zip(counter.count_many([_link_line(l.url, l.text) for l in candidates]),
                                                 counter.count_many([f'{{"url":"{l.url}","text":"{l.text}"}}' for l in candidates]))]
        chosen, _, _ = fit_budget(costs, share, len(candidates))
        picked.append([{"url": candidates[i].url, "text": candidates[i].text} for i in chosen])
    return picked


def _heading(chunk, title: str) -> str:
    """The chunk's heading path, less a first heading that begins the page's title: the answer's header names it."""
    path = [one_line(h) for h in chunk.heading_path]
    if len(path) > 1 and path[0] and one_line(title).startswith(path[0]):
        path = path[1:]
    return " > ".join(path)


@dataclass
class _Window:
    page: int
    chunks: list  # consecutive chunks of one section, page order
    rank: int  # best rank among them (the order they are shown in with order="rank")

    @property
    def text(self) -> str:
        return self.chunks[0].text + "".join(c.gap + c.text for c in self.chunks[1:])


def _windows(chosen: list[tuple[int, Chunk, int]]) -> list[_Window]:
    """Chosen (page, chunk, rank) as windows: runs of chunks that follow each other in one section."""
    windows: list[_Window] = []
    for page, chunk, rank in sorted(chosen, key=lambda x: (x[0], x[1].position)):
        last = windows[-1] if windows else None
        if last and last.page == page and last.chunks[-1].position + 1 == chunk.position and chunk.gap is not None:
            last.chunks.append(chunk)
            last.rank = min(last.rank, rank)
        else:
            windows.append(_Window(page, [chunk], rank))
    return windows


def _frames(windows: list[_Window], pages: Sequence[PageResult]) -> list[str | None]:
    """Per window in display order: its heading path when it changes (or ``[…]`` when the window does not
    follow the one before it); None for the first window of a page without headings."""
    out: list[str | None] = []
    previous: _Window | None = None
    for window in windows:
        first = window.chunks[0]
        same_page = previous is not None and previous.page == window.page
        if first.heading_path and (not same_page or previous.chunks[-1].heading_path != first.heading_path):
            out.append(_heading(first, pages[window.page].title))
        elif same_page or first.position > 0:
            out.append("")  # not where the page (or the previous window) leaves off: say so
        else:
            out.append(None)
        previous = window
    return out


def _window_line(window: _Window, frame: str | None) -> str:
    if frame is None:
        return window.text
    return f"[{frame or '…'}]\n{window.text}"


def _window_object(window: _Window) -> dict:
    return {"text": window.text, "start": window.chunks[0].start}


def scrape_page(pages: Sequence[PageResult], *, max_tokens: int, counter: TokenCounter, links_max_tokens: int,
                order: str = "page") -> Page:
    """Fill ``max_tokens`` with the pages' units (each page's best first), grouped per page.

    Links get at most ``links_max_tokens`` (and a tenth of the budget), and none below
    ``LINKS_FROM_TOKENS``: at agent-sized budgets every token goes to the passages. When even the
    outcomes and links leave no room, links go first; a budget that cannot hold the outcomes is an error.
    """
    links = links_budget(max_tokens, links_max_tokens)
    fitted = _scrape_page(pages, max_tokens, counter, links, order)
    if fitted.tokens > max_tokens:
        fitted = _scrape_page(pages, max_tokens, counter, 0, order)
    if fitted.tokens > max_tokens:
        raise RecallBudgetError(f"max_tokens={max_tokens} cannot hold even the outcomes of {len(pages)} items "
                                f"({fitted.tokens} tokens): raise it or send fewer items.")
    return fitted


# Below this budget an answer has no links (real-page dev set: links at 300 tokens cost a passage in 30).
LINKS_FROM_TOKENS = 1000


def links_budget(max_tokens: int, links_max_tokens: int) -> int:
    """Tokens an answer of ``max_tokens`` gives its links: none below ``LINKS_FROM_TOKENS``."""
    return min(links_max_tokens, max_tokens // 10) if max_tokens >= LINKS_FROM_TOKENS else 0
# A new window costs its frame in the text and its structured entry's keys and offset beyond its text (o200k:
# 6-7 for `{"text":…,"start":N}` and its comma); filling estimates with these, and the whole answer is counted
# exactly at the end. A high estimate leaves a unit out that fits; one under the cost is given back and uses a round.
_WINDOW_TEXT_COST = 4
_WINDOW_JSON_COST = 12
_BATCH = 64
# Exact counts (renders) per answer at most; more rounds add nothing on LoCoMo dev (notes/web_evidence.md).
_FILL_ROUNDS = 4


def _scrape_page(pages: Sequence[PageResult], max_tokens: int, counter: TokenCounter, links_budget: int,
                 order: str) -> Page:
    links = _pick_links(pages, links_budget, counter)
    candidates = interleave(pages)
    by_position = [{c.position: c for c in page.chunks} for page in pages]

    def header(page: PageResult) -> list[str]:
        url = page.fetch.final_url or page.item.url
        if page.outcome != "ok":
            status = f" {page.fetch.status}" if page.outcome == "http_error" and page.fetch.status else ""
            return [f"# {page.item.url}", f"{page.outcome}{status}: {one_line(page.fetch.detail or page.outcome)}"]
        return [f"# {one_line(page.title) or url}", f"<{url}>", *([f"({page.note})"] if page.note else [])]

    def shown(chosen: list[int]) -> list[tuple[_Window, str | None]]:
        windows = _windows([(candidates[k][0], candidates[k][1], k) for k in chosen])
        if order == "rank":
            windows.sort(key=lambda w: (w.page, w.rank))
        return list(zip(windows, _frames(windows, pages)))

    def render(chosen: list[int], needed: int | None = None) -> Page:
        fitted = Page(max_tokens, list(chosen), [], None, needed)
        windows = shown(chosen)
        left = len(candidates) - len(chosen)
        out: list[str] = []
        results = []
        for index, page in enumerate(pages):
            mine = [(w, f) for w, f in windows if w.page == index]
            out.extend(header(page))
            out.extend(_window_line(w, f) for w, f in mine)
            if links[index]:
                out.append("Links:")
                out.extend(_link_line(l["url"], l["text"]) for l in links[index])
            out.append("")
            entry: dict = {"url": page.item.url, "outcome": page.outcome}
            if page.fetch.final_url and page.fetch.final_url != page.item.url:
                entry["final_url"] = page.fetch.final_url
            if page.fetch.status is not None and page.outcome == "http_error":
                entry["status"] = page.fetch.status
            if page.outcome != "ok":
                entry["detail"] = page.fetch.detail or page.outcome
            else:
                entry["title"] = page.title
                if page.note:
                    entry["note"] = page.note
                entry["passages"] = [_window_object(w) for w, _ in mine]
                if links[index]:
                    entry["links"] = links[index]
            results.append(entry)
        if left:
            out.append(f"({left} more passages did not fit max_tokens={max_tokens}.)")
        fitted.text = "\n".join(out).strip()
        if needed is not None:
            fitted.text = f"Nothing fits max_tokens={max_tokens}: the best passage needs max_tokens={needed}."
        fitted.text_tokens = counter.count(fitted.text)
        structured = {"results": results, "total_tokens": fitted.text_tokens, "max_tokens": max_tokens,
                      "truncated": bool(left)}
        if left:
            structured["omitted"] = left
        if needed is not None:
            structured["needed_tokens"] = needed
        fitted.structured = structured
        fitted.structured_tokens = counter.count(to_json(structured))
        return fitted

    empty = render([])
    chosen: list[int] = []
    taken: list[set[int]] = [set() for _ in pages]
    named: set = set()  # (page, heading path) already framed
    json_cost: list[int] = []

    def fill(used_text: int, used_json: int) -> None:
        """Add the best candidates not chosen yet whose estimated cost fits what is left."""
        picked = set(chosen)
        for k, (index, chunk) in enumerate(candidates):
            if min(max_tokens - used_text, max_tokens - used_json) < 2:
                break
            if k >= len(json_cost):
                json_cost.extend(counter.count_many([to_json(c.text) for _, c in candidates[k:k + _BATCH]]))
            if k in picked:
                continue
            follows = chunk.gap is not None and chunk.position - 1 in taken[index]
            after = by_position[index].get(chunk.position + 1)
            leads = after is not None and after.gap is not None and after.position in taken[index]
            if follows or leads:
                cost_text, cost_json = chunk.tokens + 2, json_cost[k] + 1
            else:
                heading = (index, chunk.heading_path) not in named and bool(chunk.heading_path)
                frame = counter.count(_heading(chunk, pages[index].title)) if heading else 0
                cost_text, cost_json = chunk.tokens + _WINDOW_TEXT_COST + frame, json_cost[k] + _WINDOW_JSON_COST
            if used_text + cost_text <= max_tokens and used_json + cost_json <= max_tokens:
                chosen.append(k)
                taken[index].add(chunk.position)
                named.add((index, chunk.heading_path))
                used_text += cost_text
                used_json += cost_json

    # The estimates are high where windows merge (each unit was priced as a window of its own): each round
    # counts the answer exactly and fills what is left with the next best units that fit, so a large budget
    # is used, not left short by the estimate.
    fitted = empty
    for _ in range(_FILL_ROUNDS):
        before = len(chosen)
        fill(fitted.text_tokens, fitted.structured_tokens)
        while len(chosen) > before:
            trial = render(chosen)
            if trial.tokens <= max_tokens:
                break
            index, chunk = candidates[chosen.pop()]  # the estimate fell short (frames, escaping): give back the last unit
            taken[index].discard(chunk.position)
        # A heading framed only by units given back is not shown: the next round prices its frame again.
        named.clear()
        named.update((candidates[k][0], candidates[k][1].heading_path) for k in chosen)
        if len(chosen) == before:
            break
        fitted = trial
    if chosen:
        return fitted
    if not candidates:
        return empty
    first = render([0])
    return render([], needed=first.tokens)

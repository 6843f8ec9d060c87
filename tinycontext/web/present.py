"""Web answers as the agent receives them: text and structured content, both within max_tokens.

Built on :func:`tinycontext.render.fit_page`, the renderer recall uses, so a scrape or search
answer is counted the same way (text and compact JSON, frames included).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Sequence

from ..budget import TokenCounter, fit_budget
from ..errors import RecallBudgetError
from ..render import Page, fit_page, one_line

if TYPE_CHECKING:
    from .chunk import Chunk
    from .scrape import PageResult


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


def _where(chunk) -> str:
    heading = " > ".join(one_line(h) for h in chunk.heading_path)
    return f"[{heading + ' · ' if heading else ''}chars {chunk.start}-{chunk.end}]"


def scrape_page(pages: Sequence[PageResult], *, max_tokens: int, counter: TokenCounter, links_max_tokens: int,
                order: str = "page") -> Page:
    """Fill ``max_tokens`` with the pages' passages (each page's best first), grouped per page.

    Links get at most ``links_max_tokens`` (and a fifth of the budget); when even the outcomes and
    links leave no room, links go first; a budget that cannot hold the outcomes is an error.
    """
    fitted = _scrape_page(pages, max_tokens, counter, min(links_max_tokens, max_tokens // 5), order)
    if fitted.tokens > max_tokens:
        fitted = _scrape_page(pages, max_tokens, counter, 0, order)
    if fitted.tokens > max_tokens:
        raise RecallBudgetError(f"max_tokens={max_tokens} cannot hold even the outcomes of {len(pages)} items "
                                f"({fitted.tokens} tokens): raise it or send fewer items.")
    return fitted


def _scrape_page(pages: Sequence[PageResult], max_tokens: int, counter: TokenCounter, links_budget: int,
                 order: str) -> Page:
    links = _pick_links(pages, links_budget, counter)
    candidates = interleave(pages)

    def grouped(chosen: list[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {i: [] for i in range(len(pages))}
        for slot, position in enumerate(chosen):
            groups[candidates[position][0]].append(slot)
        if order == "page":
            for slots in groups.values():
                slots.sort(key=lambda s: candidates[chosen[s]][1].position)
        return groups

    def header(page: PageResult) -> list[str]:
        url = page.fetch.final_url or page.item.url
        if page.outcome != "ok":
            status = f" {page.fetch.status}" if page.outcome == "http_error" and page.fetch.status else ""
            return [f"# {page.item.url}", f"{page.outcome}{status}: {one_line(page.fetch.detail or page.outcome)}"]
        return [f"# {one_line(page.title) or url}", f"<{url}>"]

    def text(lines: list[str], fitted: Page) -> str:
        if fitted.needed is not None:
            return f"Nothing fits max_tokens={fitted.max_tokens}: the best passage needs max_tokens={fitted.needed}."
        out: list[str] = []
        for index, slots in grouped(fitted.chosen).items():
            out.extend(header(pages[index]))
            out.extend(lines[s] for s in slots)
            if links[index]:
                out.append("Links:")
                out.extend(_link_line(l["url"], l["text"]) for l in links[index])
            out.append("")
        left = len(candidates) - len(fitted.chosen)
        if left:
            out.append(f"({left} more passages did not fit max_tokens={fitted.max_tokens}.)")
        return "\n".join(out).strip()

    def structured(objects: list[dict], fitted: Page) -> dict:
        results = []
        for index, slots in grouped(fitted.chosen).items():
            page = pages[index]
            entry: dict = {"url": page.item.url, "outcome": page.outcome}
            if page.fetch.final_url and page.fetch.final_url != page.item.url:
                entry["final_url"] = page.fetch.final_url
            if page.fetch.status is not None and page.outcome == "http_error":
                entry["status"] = page.fetch.status
            if page.outcome != "ok":
                entry["detail"] = page.fetch.detail or page.outcome
            else:
                entry["title"] = page.title
                entry["passages"] = [objects[s] for s in slots]
                if links[index]:
                    entry["links"] = links[index]
            results.append(entry)
        left = len(candidates) - len(fitted.chosen)
        out = {"results": results, "total_tokens": fitted.text_tokens, "max_tokens": fitted.max_tokens,
               "truncated": bool(left)}
        if left:
            out["omitted"] = left
        if fitted.needed is not None:
            out["needed_tokens"] = fitted.needed
        return out

    def item(pair) -> dict:
        _, chunk = pair
        entry = {"text": chunk.text, "start": chunk.start, "end": chunk.end}
        if chunk.heading_path:
            entry["heading"] = " > ".join(chunk.heading_path)
        return entry

    return fit_page(candidates, max_tokens=max_tokens, counter=counter,
                    line=lambda pair: f"{_where(pair[1])}\n{pair[1].text}", item=item,
                    text_frame=text, structured_frame=structured)

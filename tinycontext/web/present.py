"""Web answers as the agent receives them: text and structured content, both within max_tokens.

Built on :func:`tinycontext.budget.render.fit_page`, the renderer recall uses, so a scrape or search
answer is counted the same way (text and compact JSON, frames included). A heading path is named
once, on the first passage under it, not on every passage: it would cost as much as a short passage.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Sequence

from ..budget.tokens import TokenCounter, fit_budget
from ..errors import RecallBudgetError
from ..budget.render import Page, fit_page, one_line

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


def _heading(chunk) -> str:
    return " > ".join(one_line(h) for h in chunk.heading_path)


def _where(chunk, heading: bool) -> str:
    path = _heading(chunk) if heading else ""
    return f"[{path + ' · ' if path else ''}chars {chunk.start}-{chunk.end}]"


def _starts_with_its_heading(chunk) -> bool:
    """A section's first passage begins with the heading line itself: the path adds nothing when it is one level."""
    return len(chunk.heading_path) == 1 and chunk.text.lstrip("#").strip().startswith(chunk.heading_path[0])


def _carries_heading(candidates: list[tuple[int, Chunk]]) -> list[bool]:
    """Which candidates pay for their heading when filling the budget: the best-ranked passage of each
    (page, heading path). The answer names a heading once, on the first passage under it (see
    ``_show_headings``), so the others cost only their text."""
    seen: set = set()
    out = []
    for page_index, chunk in candidates:
        key = (page_index, chunk.heading_path)
        out.append(bool(chunk.heading_path) and key not in seen and not _starts_with_its_heading(chunk))
        seen.add(key)
    return out


def _show_headings(chunks: list[Chunk]) -> list[bool]:
    """In display order: a passage names its heading path when it differs from the previous passage's."""
    out, previous = [], None
    for chunk in chunks:
        out.append(bool(chunk.heading_path) and chunk.heading_path != previous and not _starts_with_its_heading(chunk))
        previous = chunk.heading_path
    return out


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
    carries = _carries_heading(candidates)
    ranked = [(i, chunk, carry) for (i, chunk), carry in zip(candidates, carries)]

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

    def shown(fitted: Page, slots: list[int]) -> list[tuple[Chunk, bool]]:
        chunks = [candidates[fitted.chosen[s]][1] for s in slots]
        return list(zip(chunks, _show_headings(chunks)))

    def text(lines: list[str], fitted: Page) -> str:
        if fitted.needed is not None:
            return f"Nothing fits max_tokens={fitted.max_tokens}: the best passage needs max_tokens={fitted.needed}."
        out: list[str] = []
        for index, slots in grouped(fitted.chosen).items():
            out.extend(header(pages[index]))
            out.extend(f"{_where(chunk, named)}\n{chunk.text}" for chunk, named in shown(fitted, slots))
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
                entry["passages"] = [passage(chunk, named) for chunk, named in shown(fitted, slots)]
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

    def passage(chunk: Chunk, heading: bool) -> dict:
        entry = {"text": chunk.text, "start": chunk.start, "end": chunk.end}
        if heading:
            entry["heading"] = _heading(chunk)
        return entry

    # Filling counts each passage with its heading when it is the best of its section; the frames
    # render the headings where they change, and the whole answer is counted again at the end.
    return fit_page(ranked, max_tokens=max_tokens, counter=counter,
                    line=lambda r: f"{_where(r[1], r[2])}\n{r[1].text}", item=lambda r: passage(r[1], r[2]),
                    text_frame=text, structured_frame=structured)

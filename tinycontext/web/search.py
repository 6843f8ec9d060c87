"""search: web search through a backend, with an outcome per query.

Backends: ``ddgs`` (the ddgs package: DuckDuckGo and other engines, no key), ``searxng`` (a SearXNG
instance's JSON API at ``searxng_url``) and ``auto`` (SearXNG, then ddgs when SearXNG fails). Each
item gets the backend's results in its order and an outcome: ``ok``, ``no_results`` (the backend
answered with nothing), ``blocked`` (refused or rate limited us), ``unavailable`` (could not be
reached or answered garbage) or ``invalid`` (the item itself is bad). No browser or model starts.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from .. import telemetry
from ..budget.tokens import TokenCounter
from ..config import TinyContextConfig
from ..errors import InvalidInputError, RecallBudgetError
from ..budget.render import Page, check_agent_budget, fit_page, one_line
from .proxies import proxies_for

MAX_ITEMS = 5
MAX_QUERY_CHARS = 500
MAX_DOMAINS = 10
SEARCH_MAX_TOKENS = 2000
_DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")


@dataclass
class SearchItem:
    query: str
    domains: list[str] = field(default_factory=list)
    error: str = ""  # why the item is invalid


@dataclass
class SearchOutcome:
    item: SearchItem
    outcome: str
    backend: str = ""
    results: list[dict] = field(default_factory=list)
    detail: str = ""


class BackendFailure(Exception):
    """A backend did not answer: ``outcome`` is ``blocked`` or ``unavailable``."""

    def __init__(self, outcome: str, detail: str):
        super().__init__(detail)
        self.outcome, self.detail = outcome, detail


def _clean_domain(raw: Any) -> str | None:
    if not isinstance(raw, str):
        return None
    text = raw.strip().lower()
    if "://" in text:
        text = urlsplit(text).hostname or ""
    text = text.strip("/").removeprefix("www.").rstrip(".")
    return text if _DOMAIN.match(text) else None


def check_items(items: Any) -> list[SearchItem]:
    """1-5 items, each a query string or ``{query, domains?}``. A malformed request raises; a bad
    item (empty query, bad domain) becomes that item's ``invalid`` outcome."""
    if isinstance(items, (str, dict)):
        items = [items]
    if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= MAX_ITEMS:
        raise InvalidInputError(f"Give 1 to {MAX_ITEMS} items, each a query or {{query, domains}}.")
    out = []
    for i, raw in enumerate(items):
        if isinstance(raw, str):
            raw = {"query": raw}
        if not isinstance(raw, dict) or set(raw) - {"query", "domains"}:
            raise InvalidInputError(f"Item {i}: use {{query, domains}}.")
        query, domains = raw.get("query"), raw.get("domains") or []
        item = SearchItem(one_line(query) if isinstance(query, str) else "")
        if not item.query:
            item.error = "query must be a non-empty string"
        elif len(item.query) > MAX_QUERY_CHARS:
            item.error = f"query is longer than {MAX_QUERY_CHARS} characters"
        elif isinstance(domains, str):
            domains = [domains]
        if not item.error:
            if not isinstance(domains, list) or len(domains) > MAX_DOMAINS:
                item.error = f"domains must be a list of at most {MAX_DOMAINS} domain names"
            else:
                cleaned = [_clean_domain(d) for d in domains]
                if None in cleaned:
                    item.error = f"not a domain name: {domains[cleaned.index(None)]!r}"
                item.domains = list(dict.fromkeys(d for d in cleaned if d))
        out.append(item)
    return out


def in_domains(url: str, domains: list[str]) -> bool:
    """True when ``url``'s host is one of ``domains`` or a subdomain of one."""
    if not domains:
        return True
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return False
    return any(host == d or host.endswith("." + d) for d in domains)


def backend_query(item: SearchItem) -> str:
    if not item.domains:
        return item.query
    sites = " OR ".join(f"site:{d}" for d in item.domains)
    return f"{item.query} {sites if len(item.domains) == 1 else f'({sites})'}"


def _result(title: Any, url: Any, snippet: Any, date: Any = None) -> dict | None:
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        return None
    out = {"title": one_line(str(title or "")), "url": url, "snippet": one_line(str(snippet or ""))}
    if date:
        out["date"] = str(date)
    return out


def ddgs_search(item: SearchItem, config: TinyContextConfig) -> list[dict]:
    """Results from the ddgs package (blocking)."""
    from ddgs import DDGS
    from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

    try:
        # ddgs picks its engines itself, so proxy_bypass (per target) does not apply to it.
        upstream = proxies_for(config).next()
        raw = DDGS(proxy=upstream.url_with_credentials() if upstream else None,
                   timeout=int(max(1, config.search_timeout))).text(backend_query(item), max_results=config.search_max_results)
    except RatelimitException as exc:
        raise BackendFailure("blocked", f"ddgs: rate limited ({exc})") from exc
    except TimeoutException as exc:
        raise BackendFailure("unavailable", f"ddgs: timed out ({exc})") from exc
    except DDGSException as exc:
        if str(exc) == "No results found.":
            return []
        raise BackendFailure("unavailable", f"ddgs: {exc}") from exc
    return [r for r in (_result(x.get("title"), x.get("href") or x.get("url"), x.get("body"), x.get("date"))
                        for x in raw or [] if isinstance(x, dict)) if r]


def searxng_search(item: SearchItem, config: TinyContextConfig) -> list[dict]:
    """Results from SearXNG's JSON API at ``config.searxng_url`` (blocking). The URL is operator
    configuration, not agent input, so it may be local and is not passed through the SSRF guard."""
    if not config.searxng_url:
        raise BackendFailure("unavailable", "searxng: searxng_url is not configured")
    url = config.searxng_url.rstrip("/") + "/search"
    upstream = proxies_for(config).for_host(urlsplit(url).hostname or "")
    try:
        with httpx.Client(timeout=config.search_timeout, trust_env=False, follow_redirects=False,
                          proxy=upstream.httpx_proxy() if upstream else None) as client:
            response = client.get(url, params={"q": backend_query(item), "format": "json"},
                                  headers={"Accept": "application/json", "User-Agent": config.web_user_agent})
    except httpx.HTTPError as exc:
        raise BackendFailure("unavailable", f"searxng: {type(exc).__name__}: {exc}") from exc
    if response.status_code in (401, 403, 429):
        raise BackendFailure("blocked", f"searxng: HTTP {response.status_code} (is the json format enabled?)")
    if response.status_code != 200:
        raise BackendFailure("unavailable", f"searxng: HTTP {response.status_code}")
    try:
        data = response.json()
        raw = data["results"]
        if not isinstance(raw, list):
            raise TypeError("results is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendFailure("unavailable", f"searxng: not a JSON search answer ({exc})") from exc
    results = [_result(x.get("title"), x.get("url"), x.get("content"), x.get("publishedDate"))
               for x in raw if isinstance(x, dict)]
    return [r for r in results if r][: config.search_max_results]


BACKENDS: dict[str, Callable[[SearchItem, TinyContextConfig], list[dict]]] = {"ddgs": ddgs_search, "searxng": searxng_search}


def _search_one(item: SearchItem, config: TinyContextConfig) -> SearchOutcome:
    if item.error:
        return SearchOutcome(item, "invalid", detail=item.error)
    order = {"ddgs": ["ddgs"], "searxng": ["searxng"], "auto": ["searxng", "ddgs"]}[config.search_backend]
    failure: BackendFailure | None = None
    for name in order:
        with telemetry.operation("search.backend", backend=name) as op:
            try:
                found = BACKENDS[name](item, config)
            except BackendFailure as exc:
                failure = exc
                op.outcome(exc.outcome)
                continue
            results = [r for r in found if in_domains(r["url"], item.domains)]
            seen: set[str] = set()
            results = [r for r in results if not (r["url"] in seen or seen.add(r["url"]))]
            op.set(outcome="ok" if results else "no_results", results=len(results))
            return SearchOutcome(item, "ok" if results else "no_results", name, results)
    return SearchOutcome(item, failure.outcome, order[-1], detail=failure.detail)


def search_page(outcomes: list[SearchOutcome], *, max_tokens: int, counter: TokenCounter) -> Page:
    """Results of all queries (each query's first, then each one's second...) within ``max_tokens``."""
    columns = [[(i, r) for r in o.results] for i, o in enumerate(outcomes)]
    candidates = [pair for rank in range(max((len(c) for c in columns), default=0))
                  for column in columns if rank < len(column) for pair in [column[rank]]]

    def line(pair) -> str:
        _, r = pair
        date = f" ({r['date'][:10]})" if r.get("date") else ""
        return f"- {r['title'] or r['url']}{date} <{r['url']}>" + (f"\n  {r['snippet']}" if r["snippet"] else "")

    def grouped(chosen: list[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {i: [] for i in range(len(outcomes))}
        for slot, position in enumerate(chosen):
            groups[candidates[position][0]].append(slot)
        return groups

    def text(lines: list[str], fitted: Page) -> str:
        out = []
        for index, slots in grouped(fitted.chosen).items():
            o = outcomes[index]
            out.append(f"# {o.item.query}" + ("" if o.outcome == "ok" else f"\n{o.outcome}" + (f": {o.detail}" if o.detail else "")))
            out.extend(lines[s] for s in slots)
        left = len(candidates) - len(fitted.chosen)
        if left:
            out.append(f"({left} more results did not fit max_tokens={fitted.max_tokens}.)")
        return "\n".join(out)

    def structured(objects: list[dict], fitted: Page) -> dict:
        results = []
        for index, slots in grouped(fitted.chosen).items():
            o = outcomes[index]
            entry: dict = {"query": o.item.query, "outcome": o.outcome}
            if o.backend:
                entry["backend"] = o.backend
            if o.detail:
                entry["detail"] = o.detail
            entry["results"] = [objects[s] for s in slots]
            results.append(entry)
        left = len(candidates) - len(fitted.chosen)
        return {"searches": results, "total_tokens": fitted.text_tokens, "max_tokens": fitted.max_tokens,
                "truncated": bool(left)}

    return fit_page(candidates, max_tokens=max_tokens, counter=counter, line=line, item=lambda pair: pair[1],
                    text_frame=text, structured_frame=structured)


async def asearch(items: Any, max_tokens: int | None = None, *, config: TinyContextConfig | None = None) -> dict:
    """Search 1-5 ``{query, domains?}`` items concurrently; the answer (``searches`` per item with
    ``outcome`` and ``results``, plus its rendering under ``text``) fits ``max_tokens``."""
    config = config or TinyContextConfig()
    with telemetry.operation("search", backend=config.search_backend) as op:
        parsed = check_items(items)
        budget = check_agent_budget(SEARCH_MAX_TOKENS if max_tokens is None else max_tokens)
        op.set(items=len(parsed), max_tokens=budget)
        outcomes = list(await asyncio.gather(*(asyncio.to_thread(_search_one, item, config) for item in parsed)))
        fitted = search_page(outcomes, max_tokens=budget, counter=TokenCounter(config.encoding_name))
        if fitted.tokens > budget:
            raise RecallBudgetError(f"max_tokens={budget} cannot hold even the outcomes of {len(parsed)} searches "
                                    f"({fitted.tokens} tokens): raise it or send fewer items.")
        op.set(results=len(fitted.chosen), tokens=fitted.tokens, truncated=fitted.truncated)
        return {**fitted.structured, "text": fitted.text}


def search(items: Any, max_tokens: int | None = None, *, config: TinyContextConfig | None = None) -> dict:
    """Blocking :func:`asearch`."""
    return asyncio.run(asearch(items, max_tokens, config=config))

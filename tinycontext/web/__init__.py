"""Web evidence: search the web and hand the agent only the passages worth reading.

``search(items)`` runs web searches; ``scrape_urls(items, max_tokens)`` fetches pages (through the
SSRF guard), extracts their main content and returns the passages that answer each item's query,
within one token budget; ``current_datetime()`` tells the time. Async variants: ``asearch``,
``ascrape_urls``.
"""

from ..errors import MissingExtraError

try:  # the web extra: a core install says which pip command brings it
    import httpx, lxml, pypdf, trafilatura  # noqa: F401, E401
except ImportError as exc:
    raise MissingExtraError(f"The web tools need {exc.name}: pip install 'tinycontext[web]'") from exc

from .clock import current_datetime
from .fetch import Fetcher, FetchResult, HttpFetcher
from .guard import BlockedURLError, Decision, Guard, GuardedTransport, classify, decide
from .scrape import ascrape_urls, scrape_urls
from .search import asearch, search

__all__ = ["search", "asearch", "scrape_urls", "ascrape_urls", "current_datetime", "Fetcher", "FetchResult",
           "HttpFetcher", "BlockedURLError", "Decision", "Guard", "GuardedTransport", "classify", "decide"]

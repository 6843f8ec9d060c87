"""Browser tools: read pages that need a real browser through a compact accessibility view with refs.

``browser_navigate`` and ``browser_act`` (MCP tools and REST endpoints, see tinycontext/servers/) drive a
system Chromium with Playwright; :mod:`.snapshot` turns the page into the view, :mod:`.service`
keeps one isolated session per client, :mod:`.proxy` puts every request through the SSRF guard.
"""

from .service import ACTIONS, BrowserBusyError, BrowserError, BrowserService, close_services, get_service

__all__ = ["ACTIONS", "BrowserBusyError", "BrowserError", "BrowserService", "close_services", "get_service"]

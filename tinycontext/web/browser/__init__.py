"""Browser tools: read pages that need a real browser through a compact accessibility view with refs.

``browser_navigate`` and ``browser_act`` (MCP tools and REST endpoints, see tinycontext/servers/) drive a
system Chromium with Playwright; :mod:`.snapshot` turns the page into the view, :mod:`.service`
keeps one isolated session per client (its state: :mod:`.session`; acting on a tab: :mod:`.page`),
:mod:`.proxy` puts every request through the SSRF guard, :mod:`.launch` finds and starts Chromium.
"""

from .service import ACTIONS, BrowserService, close_services, get_service
from .session import BrowserBusyError, BrowserError

__all__ = ["ACTIONS", "BrowserBusyError", "BrowserError", "BrowserService", "close_services", "get_service"]

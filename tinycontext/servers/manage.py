"""Management views (``management=on``): MCP resources under ``tinycontext://manage/`` and the same
views over REST under ``/manage/``, built on the activity records (docs/management.md).

The manifest (``tinycontext://manage/manifest``) lists every view with its scope and whether this
caller may read it. Instance views (``health``, ``domains``, ``rules``) are the operator's: a stdio
client, or over HTTP a request with the management token. Per-caller views (``my/searches``,
``my/pages``, ``my/memory``) and the ``clear_my_history`` tool need a caller identity (stdio: the
operator; HTTP: a trusted proxy's identity header, see :mod:`tinycontext.servers.activity`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..activity import MEMORY, PAGES, SEARCHES, open_activity
from ..budget.render import to_json
from ..config import TinyContextConfig
from ..errors import ConfigError, TinyContextError
from ..version import __version__
from . import tools
from .activity import PROXY_TOKEN_HEADER, Caller

SCHEME = "tinycontext://manage/"


class UnauthorizedError(TinyContextError):
    code = "unauthorized"


class ForbiddenError(TinyContextError):
    code = "forbidden"


@dataclass(frozen=True)
class View:
    path: str
    scope: str  # "instance" (the operator's) or "caller" (one's own records)
    title: str
    description: str
    operations: tuple[str, ...] = ()

    @property
    def uri(self) -> str:
        return SCHEME + self.path

    @property
    def rest(self) -> str:
        return "/manage/" + self.path


VIEWS = (
    View("health", "instance", "Health and counts",
         "Version, memory counts, and the activity records by operation and outcome."),
    View("domains", "instance", "Domains discovered vs fetched",
         "Each domain, how often searches found it and how often pages were read from it (content mode)."),
    View("rules", "instance", "Blocking rules",
         "The built-in SSRF rules every fetch obeys, the web limits, and how many items were blocked."),
    View("my/searches", "caller", "My searches", "Your web searches: time, outcome, counts.", SEARCHES),
    View("my/pages", "caller", "My pages", "Your page reads (scrape, browser): time, outcome, counts.", PAGES),
    View("my/memory", "caller", "My memory activity", "Your memory calls: time, outcome, counts.", MEMORY),
)
BY_PATH = {view.path: view for view in VIEWS}

CLEAR_TOOL = tools.ToolSpec(
    "clear_my_history", "management", "Clear my history",
    "Delete the activity records of your own calls (searches, pages, memory activity).", {}, tools.NoArguments,
    destructive=True, idempotent=True)


def clear_offered(config: TinyContextConfig) -> bool:
    return config.management and config.activity != "off"


def check_serving(config: TinyContextConfig) -> None:
    """Refuse to serve management over HTTP that nobody could use safely: with neither a management
    token nor a trusted proxy (addresses and proxy token together)."""
    if not config.management:
        return
    proxies, proxy_token = bool(config.management_trusted_proxies), config.management_proxy_token is not None
    if proxies != proxy_token:
        raise ConfigError("Refusing to serve management over HTTP: management_trusted_proxies and management_proxy_token "
                          "go together (set both, or neither).")
    if config.management_token is None and not proxies:
        raise ConfigError("Refusing to serve management over HTTP without access control: set TINYCONTEXT_MANAGEMENT_TOKEN "
                          "(instance views) or TINYCONTEXT_MANAGEMENT_TRUSTED_PROXIES with TINYCONTEXT_MANAGEMENT_PROXY_TOKEN "
                          "(per-caller views), or TINYCONTEXT_MANAGEMENT=off.")


def _may_read(view: View, caller: Caller) -> bool:
    return caller.operator if view.scope == "instance" else caller.identity is not None


def _refuse(view: View, caller: Caller) -> None:
    if _may_read(view, caller):
        return
    if view.scope == "instance":
        raise UnauthorizedError(f"{view.uri} is the operator's: send 'Authorization: Bearer <management_token>'.")
    raise ForbiddenError(f"{view.uri} needs your identity from a trusted proxy ({caller.why}); the proxy sends it with "
                         f"{PROXY_TOKEN_HEADER}.")


def manifest(config: TinyContextConfig, caller: Caller) -> dict:
    activity = open_activity(config)
    return {
        "version": __version__, "activity": config.activity,
        "you": {"operator": caller.operator, "identified": caller.identity is not None,
                "caller": activity.caller_hash(caller.identity)[:16] if activity and caller.identity else None},
        "views": [{"uri": v.uri, "rest": v.rest, "scope": v.scope, "title": v.title, "description": v.description,
                   "readable": _may_read(v, caller)} for v in VIEWS],
        "tools": [CLEAR_TOOL.name] if clear_offered(config) else [],
    }


def read_view(config: TinyContextConfig, caller: Caller, path: str, engine: Callable[[], Any]) -> dict:
    """One view for ``caller`` (refused with unauthorized/forbidden when not theirs); ``engine`` opens
    the memory engine (the health view's counts)."""
    view = BY_PATH[path]
    _refuse(view, caller)
    activity = open_activity(config)
    if view.scope == "caller":
        if activity is None:
            return {"activity": "off", "events": []}
        mine = activity.caller_hash(caller.identity)
        return {"activity": config.activity, "caller": mine[:16], "events": activity.events(mine, view.operations)}
    if path == "health":
        try:
            stats = engine().stats()
            memory = {k: stats[k] for k in ("memories", "tokens", "vectors", "sessions", "schema_version")}
            memory["embedder"] = (stats["embedder"] or {}).get("model")
        except TinyContextError as err:
            memory = {"error": err.code}
        return {"status": "ok", "version": __version__, "memory": memory,
                "activity": activity.summary() if activity else {"mode": "off"}}
    if path == "domains":
        return {"activity": config.activity, "domains": activity.domains() if activity else [],
                "note": "Domains are kept in content mode only; history mode keeps counts, not names."}
    try:
        from ..web.guard import rules

        ssrf: dict = rules(allow_private_hosts=config.allow_private_hosts)
    except TinyContextError as err:  # the web extra is not installed: no fetches, nothing to guard
        ssrf = {"error": err.code}
    limits = ("web_max_bytes", "web_max_redirects", "web_fetch_timeout", "web_item_timeout", "search_max_results")
    return {"ssrf": ssrf, "limits": {name: getattr(config, name) for name in limits},
            "blocked_items": activity.blocked_items() if activity else None}


def clear_mine(config: TinyContextConfig, caller: Caller) -> dict:
    if caller.identity is None:
        raise ForbiddenError(f"clear_my_history needs your identity from a trusted proxy ({caller.why}).")
    activity = open_activity(config)
    return {"deleted": activity.clear(activity.caller_hash(caller.identity)) if activity else 0}


def register_mcp(server, config: TinyContextConfig, engine: Callable[[], Any], caller: Callable[[], Caller]) -> None:
    """The manifest and views as resources on the MCP ``server`` (and the clear tool when there are records)."""
    import anyio

    def add(uri: str, name: str, description: str, read: Callable[[Caller], dict]) -> None:
        async def resource() -> str:
            who = caller()  # in the request's task: the HTTP request (or none, stdio) is known here
            return to_json(await anyio.to_thread.run_sync(lambda: read(who)))

        server.resource(uri, name=name, mime_type="application/json", description=description)(resource)

    add(SCHEME + "manifest", "manage-manifest", "The management views, their scope, and which you may read.",
        lambda who: manifest(config, who))
    for view in VIEWS:
        add(view.uri, "manage-" + view.path.replace("/", "-"), view.description,
            lambda who, path=view.path: read_view(config, who, path, engine))

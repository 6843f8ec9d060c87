"""Who is calling, and the one hook per adapter that writes activity records (tinycontext.activity).

A local stdio (or in-process) client is the operator. Over HTTP a request is the operator when it
carries ``Authorization: Bearer <management_token>``, and it has a caller identity only when the
identity header comes from an address in ``management_trusted_proxies`` together with the proxy
token in ``X-TinyContext-Proxy-Token``; every token is compared in constant time. The MCP server
records in :meth:`TinyContextMCP.call_tool`, the REST app in :class:`RestRecorder` (one middleware).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..activity import ActivityLog, Event, open_activity
from ..activity.log import CODE
from ..config import TinyContextConfig
from ..errors import TinyContextError

log = logging.getLogger(__name__)

PROXY_TOKEN_HEADER = "X-TinyContext-Proxy-Token"
MAX_IDENTITY_CHARS = 256


@dataclass(frozen=True)
class Caller:
    """``identity`` is the raw caller (hashed before it is stored; None: unidentified); ``operator`` may
    read the instance views; ``why`` says, for an unidentified HTTP caller, what was missing."""

    transport: str
    identity: str | None
    operator: bool
    why: str = ""


LOCAL = Caller("stdio", "local:operator", True)


def _same(supplied: str, expected: str) -> bool:
    return hmac.compare_digest(supplied.encode("utf-8"), expected.encode("utf-8"))


def http_caller(config: TinyContextConfig, transport: str, client_host: str | None, headers: Mapping[str, str]) -> Caller:
    """The caller of one HTTP request (``headers`` case-insensitive, as Starlette's)."""
    scheme, _, supplied = (headers.get("authorization") or "").strip().partition(" ")
    operator = (config.management_token is not None and scheme.lower() == "bearer"
                and _same(supplied.strip(), config.management_token.get_secret_value()))
    claimed = (headers.get(config.management_identity_header) or "").strip()
    if not claimed:
        return Caller(transport, None, operator, f"no {config.management_identity_header} header")
    if not config.management_trusted_proxies or config.management_proxy_token is None:
        return Caller(transport, None, operator, "this server trusts no proxy (management_trusted_proxies, "
                                                 "management_proxy_token)")
    try:
        address = ipaddress.ip_address((client_host or "").split("%")[0])
    except ValueError:
        address = None
    if address is None or not any(address in ipaddress.ip_network(c) for c in config.management_trusted_proxies):
        return Caller(transport, None, operator, f"{config.management_identity_header} came from an address that "
                                                 "is not in management_trusted_proxies")
    if not _same(headers.get(PROXY_TOKEN_HEADER) or "", config.management_proxy_token.get_secret_value()):
        return Caller(transport, None, operator, f"missing or wrong {PROXY_TOKEN_HEADER}")
    return Caller(transport, "user:" + claimed[:MAX_IDENTITY_CHARS], operator)


def caller_of_request(config: TinyContextConfig, request: Any, transport: str = "mcp-http") -> Caller:
    """An MCP request's caller: its HTTP request's, or the operator's when there is none (stdio)."""
    if request is None:
        return LOCAL
    client = getattr(request, "client", None)
    return http_caller(config, transport, client.host if client else None, request.headers)


async def record(activity: ActivityLog, caller: Caller, operation: str, *, outcome: str, started: float,
                 request: Any = None, answer: Any = None, shown: str | None = None) -> None:
    """Write one record off the event loop; a failing activity file is logged, never the call's failure."""
    event = Event(operation=operation, outcome=outcome, duration_ms=round((time.perf_counter() - started) * 1000),
                  transport=caller.transport, caller=caller.identity, request=request, answer=answer, shown=shown)
    try:
        await anyio.to_thread.run_sync(activity.record, event)
    except TinyContextError as err:
        log.warning("activity record not written: %s", err)


def error_code(text: str) -> str:
    """The code an error answer starts with (``code: message``), else ``error``."""
    code = text.partition(":")[0].strip()
    return code if CODE.fullmatch(code) else "error"


def rest_operations() -> dict[str, str]:
    """REST path -> the MCP tool it mirrors (the operation recorded)."""
    from .tools import specs

    names = {spec.name for spec in specs(TinyContextConfig())}
    paths = {f"/{name}": name for name in names}
    paths.update({"/sessions": "list_sessions", "/browser/navigate": "browser_navigate", "/browser/act": "browser_act"})
    return {path: name for path, name in paths.items() if name in names}


class RestRecorder:
    """ASGI middleware in front of the REST tool routes: one record per call, with the JSON body asked
    and the JSON body answered (the REST caller's "what the model was shown") in content mode; history
    mode keeps neither, so it reads only the answer (for its counts) and leaves the request alone."""

    def __init__(self, app: ASGIApp, *, config: Callable[[], TinyContextConfig]):
        self.app, self.config = app, config
        self.operations = rest_operations()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = self.operations.get(scope.get("path", "")) if scope["type"] == "http" else None
        activity = None
        if operation is not None:
            try:
                config = self.config()
                activity = open_activity(config)
            except TinyContextError as err:
                log.warning("activity records unavailable: %s", err)
        if activity is None:
            return await self.app(scope, receive, send)
        content = activity.mode == "content"
        asked, answered, status = bytearray(), bytearray(), [0]

        async def keep_request() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                asked.extend(message.get("body", b""))
            return message

        async def keep_response(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                answered.extend(message.get("body", b""))
            await send(message)

        started = time.perf_counter()
        await self.app(scope, keep_request if content else receive, keep_response)
        body = _json(answered)
        ok = 200 <= status[0] < 300
        outcome = "ok" if ok else (body.get("code") if isinstance(body, dict) and isinstance(body.get("code"), str) else "error")
        caller = http_caller(config, "rest", (scope.get("client") or (None,))[0], Headers(scope=scope))
        await record(activity, caller, operation, outcome=outcome, started=started, request=_json(asked) if content else None,
                     answer=body if ok else None, shown=answered.decode("utf-8", "replace") if content else None)


def _json(raw: bytes | bytearray) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None

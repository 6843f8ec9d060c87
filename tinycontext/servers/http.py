"""Serving over the network: MCP over Streamable HTTP (or SSE) and the REST app, with one guard.

Both apps sit behind :class:`Guard`, an ASGI middleware that checks the bearer token
(``TINYCONTEXT_API_TOKEN``) on every request and caps request bodies. Listening beyond loopback
without a token is refused at startup; a server started some other way (``uvicorn ... --host
0.0.0.0``) still answers non-loopback clients with 401 until a token is set.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal, Mapping

from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import TinyContextConfig
from ..errors import ConfigError

TOKEN_ENV = "TINYCONTEXT_API_TOKEN"
TOKEN_FILE_ENV = TOKEN_ENV + "_FILE"
MIN_TOKEN_CHARS = 24
MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_PORT = 8765
# Seconds a stopping server waits for open streams (an MCP client's SSE GET) before cancelling them;
# under `docker stop`'s 10 s so the engines still close cleanly.
SHUTDOWN_GRACE_S = 5
Transport = Literal["stdio", "sse", "streamable-http"]
TRANSPORTS: tuple[str, ...] = ("stdio", "sse", "streamable-http")
# Headers a browser client needs for MCP over HTTP (session id and protocol version travel as headers).
CORS_HEADERS = ["Authorization", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID"]


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(env: Mapping[str, str] | None = None) -> str | None:
    """The API token from ``TINYCONTEXT_API_TOKEN``, else from the file ``TINYCONTEXT_API_TOKEN_FILE``
    names (a Docker or compose secret), else None; a token too short to be safe is an error."""
    env = os.environ if env is None else env
    token = env.get(TOKEN_ENV, "").strip()
    if not token and env.get(TOKEN_FILE_ENV, "").strip():
        path = env[TOKEN_FILE_ENV].strip()
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Cannot read the token file {TOKEN_FILE_ENV}={path}: {exc}.") from exc
        if not token:
            raise ConfigError(f"The token file {TOKEN_FILE_ENV}={path} is empty.")
    if not token:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters; generate one with "
                          "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`.")
    return token


@dataclass(frozen=True)
class ServeSettings:
    """Where and how to serve. ``from_env`` reads MCP_HOST, MCP_PORT, MCP_TRANSPORT, MCP_CORS_ORIGINS."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    transport: Transport = "streamable-http"
    cors_origins: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)  # never shown in logs or reprs
    max_body_bytes: int = MAX_BODY_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "ServeSettings":
        env = os.environ if env is None else env
        values: dict = {"token": read_token(env)}
        if env.get("MCP_HOST"):
            values["host"] = env["MCP_HOST"].strip()
        if env.get("MCP_PORT"):
            try:
                values["port"] = int(env["MCP_PORT"])
            except ValueError as exc:
                raise ConfigError(f"MCP_PORT must be a port number, not {env['MCP_PORT']!r}.") from exc
        if env.get("MCP_TRANSPORT"):
            values["transport"] = env["MCP_TRANSPORT"].strip().lower()
        if env.get("MCP_CORS_ORIGINS"):
            values["cors_origins"] = tuple(o.strip() for o in env["MCP_CORS_ORIGINS"].split(",") if o.strip())
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        if settings.transport not in TRANSPORTS:
            raise ConfigError(f"MCP_TRANSPORT must be one of {', '.join(TRANSPORTS)}, not {settings.transport!r}.")
        if not 0 <= settings.port <= 65535:
            raise ConfigError(f"MCP_PORT must be 0-65535, not {settings.port}.")
        return settings

    def check_bind(self) -> None:
        """Refuse to listen beyond loopback without a token: the memories would be open to the network."""
        if self.transport != "stdio" and not is_loopback(self.host) and not self.token:
            raise ConfigError(f"Refusing to listen on {self.host} without authentication: set {TOKEN_ENV} "
                              f"(at least {MIN_TOKEN_CHARS} characters, e.g. from `python -c 'import secrets; "
                              f"print(secrets.token_urlsafe(32))'`) or {TOKEN_FILE_ENV}, or bind 127.0.0.1.")


class Guard:
    """ASGI middleware: bearer-token check and request-body cap, answering ``{code, message}``."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; neither app has websocket routes
            return await self.app(scope, receive, send)
        refusal = self._refuse(scope)
        if refusal:
            return await _reply(send, *refusal)
        length = _header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await _reply(send, 413, "payload_too_large", f"Request bodies are limited to {self.max_body_bytes} bytes.")
        return await self._capped(scope, receive, send)

    def _refuse(self, scope: Scope) -> tuple | None:
        if self.token is None:
            if _remote_client(scope):
                return 401, "unauthorized", f"This server has no {TOKEN_ENV} set, so it only answers loopback clients."
            return None
        header = (_header(scope, b"authorization") or "").strip()
        scheme, _, supplied = header.partition(" ")
        # compare_digest: the time taken must not reveal how much of the token matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode("utf-8"), self.token):
            return 401, "unauthorized", "Missing or wrong bearer token: send 'Authorization: Bearer <TINYCONTEXT_API_TOKEN>'."
        return None

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Count streamed body bytes too: a chunked request has no Content-Length to check up front."""
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _TooLarge(self.max_body_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge as exc:
            if started:
                raise
            await _reply(send, 413, "payload_too_large", exc.detail)


class _TooLarge(HTTPException):
    """An HTTPException so that frameworks which wrap body-read errors (FastAPI) still answer 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"Request bodies are limited to {limit} bytes.")


def _remote_client(scope: Scope) -> bool:
    """True for a client at a non-loopback IP. Unix sockets and in-process test clients have none."""
    host = (scope.get("client") or ("",))[0] or ""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _reply(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="tinycontext"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def guarded(app: ASGIApp, settings: ServeSettings) -> ASGIApp:
    """``app`` behind the guard, with CORS outermost so browser preflights (which carry no token) work."""
    app = Guard(app, token=settings.token, max_body_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app = CORSMiddleware(app, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                             allow_headers=CORS_HEADERS, expose_headers=["Mcp-Session-Id"])
    return app


def mcp_app(settings: ServeSettings, config: TinyContextConfig | None = None) -> ASGIApp:
    """The MCP server (the same tools as stdio) as an ASGI app for ``settings.transport``."""
    from mcp.server.transport_security import TransportSecuritySettings

    from ..config import load_config
    from .health import add_health_route
    from .mcp_server import build_server

    config = config or load_config()
    server = build_server(config)
    server.settings.max_request_body_size = settings.max_body_bytes
    add_health_route(server, config)
    if is_loopback(settings.host):
        # The SDK's DNS-rebinding check: keep its loopback defaults and admit the configured browser origins.
        security = server.settings.transport_security or TransportSecuritySettings(
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"])
        security.allowed_origins = [*security.allowed_origins, *settings.cors_origins]
    else:
        # Reachable under names we cannot know; the bearer token is what protects a non-loopback server.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    server.settings.transport_security = security
    app = server.sse_app() if settings.transport == "sse" else server.streamable_http_app()
    return guarded(app, settings)


def rest_app(settings: ServeSettings, config: TinyContextConfig | None = None) -> ASGIApp:
    from .fastapi_server import create_app

    return create_app(config, settings=settings)


@contextmanager
def background(app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` on a thread (port 0: a free one) and yield its base URL; stops on exit.
    For tests, notebooks and benchmarks, so loopback only."""
    import uvicorn

    if not is_loopback(host):
        raise ConfigError("background() serves loopback only; use serve() for a network server.")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="tinycontext-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ConfigError(f"The HTTP server did not start on {host}:{port}; see the log above.")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout)


def serve(settings: ServeSettings, config: TinyContextConfig | None = None, *, rest: bool = False, log_level: str = "warning") -> None:
    """Run until SIGINT/SIGTERM: MCP over ``settings.transport`` (sse or streamable-http) or, with
    ``rest``, the REST app. The stdio transport is the ``tinycontext mcp`` command's job.

    The engine opens before the port does, so a bad database, model or volume stops the server with
    its error instead of a listener that fails every call. On a stop signal uvicorn stops accepting,
    lets requests in flight finish (streams still open after ``SHUTDOWN_GRACE_S`` are cancelled),
    then the engines close, which checkpoints the WAL into the database file."""
    import sys

    import uvicorn

    from ..config import load_config
    from ..engine import close_engines, get_engine

    settings.check_bind()
    if settings.transport == "stdio" and not rest:
        raise ConfigError("The stdio transport is not a network server: run `tinycontext mcp`.")
    config = config or load_config()
    try:
        get_engine(config)
        app = rest_app(settings, config) if rest else mcp_app(settings, config)
        what = "REST API (docs at /docs)" if rest else f"MCP over {settings.transport} at /{'sse' if settings.transport == 'sse' else 'mcp'}"
        auth = "bearer token required" if settings.token else "no token (loopback only)"
        print(f"TinyContext {what} on http://{settings.host}:{settings.port}; {auth}. Ctrl-C to stop.", file=sys.stderr)
        server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                               server_header=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
        with _sigterm_returns():
            try:
                server.run()
            except SystemExit as exc:  # uvicorn exits this way when it cannot start, after logging why
                raise ConfigError(f"The server could not start on {settings.host}:{settings.port} (see the error above). "
                                  "If the port is in use, stop the other server or set MCP_PORT.") from exc
    finally:
        close_engines()
    print("TinyContext stopped: requests finished, database checkpointed and closed.", file=sys.stderr)


@contextmanager
def _sigterm_returns() -> Iterator[None]:
    """After its graceful shutdown uvicorn raises the stop signal again; SIGTERM's default action would
    end the process before the engines close, so here it is ignored and ``serve`` returns normally."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

"""The guard in front of both network apps (MCP over HTTP and REST): a leaf module both import.

:class:`Guard` is ASGI middleware that, on every HTTP request:

1. refuses a ``Host`` that is not a loopback name or a configured host (421), and an ``Origin``,
   when sent, that is neither this server's own (the request's Host) nor a configured CORS origin
   (403). A web page whose domain an attacker points at 127.0.0.1 (DNS rebinding) sends its own
   name as Host and Origin, and a page of another server on this machine (another loopback port)
   its own origin, so neither can read or plant memories through this server;
2. checks the bearer token (``TINYCONTEXT_API_TOKEN``) with a constant-time compare (401), except on
   the open paths an app names: the memory browser's static page, script and style, which hold no
   data (a browser cannot send a bearer header when it opens a URL; the page asks for the token);
3. caps request bodies, streamed ones included (413).

Listening beyond loopback without a token is refused at startup; a server started some other way
still answers non-loopback clients with 401 until a token is set. :func:`protect` installs the
guard and the one CORS policy on an app.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import TRANSPORTS
from ..errors import ConfigError

TOKEN_ENV = "TINYCONTEXT_API_TOKEN"
TOKEN_FILE_ENV = TOKEN_ENV + "_FILE"
MIN_TOKEN_CHARS = 24
MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_PORT = 8765
Transport = Literal["stdio", "sse", "streamable-http"]
# Headers a browser client needs for MCP over HTTP (session id and protocol version travel as headers).
CORS_HEADERS = ["Authorization", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID"]
CORS_METHODS = ["GET", "POST", "DELETE", "OPTIONS"]
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
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


def _split_list(raw: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (raw or "").split(",") if item.strip())


@dataclass(frozen=True)
class ServeSettings:
    """Where and how to serve. ``from_env`` reads MCP_HOST, MCP_PORT, MCP_TRANSPORT,
    MCP_CORS_ORIGINS and MCP_ALLOWED_HOSTS (names besides loopback that clients may use as Host)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    transport: Transport = "streamable-http"
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)  # never shown in logs or reprs
    # The management token (management views) also passes the bearer check where a token is required.
    management_token: str | None = field(default=None, repr=False)
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
            values["cors_origins"] = _split_list(env["MCP_CORS_ORIGINS"])
        if env.get("MCP_ALLOWED_HOSTS"):
            values["allowed_hosts"] = tuple(h.lower() for h in _split_list(env["MCP_ALLOWED_HOSTS"]))
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

    @property
    def checks_host(self) -> bool:
        """Host/Origin are checked on a loopback server (the rebinding target) or when hosts are configured.
        A token-protected server on a public address answers to names we cannot know; its token protects it."""
        return is_loopback(self.host) or bool(self.allowed_hosts)


class Guard:
    """ASGI middleware: Host/Origin allow-list, bearer token and body cap, answering ``{code, message}``."""

    def __init__(self, app: ASGIApp, *, settings: ServeSettings, open_paths: tuple[str, ...] = ()):
        self.app = app
        self.settings = settings
        # Paths served without the token (an entry ending in "/" is a prefix); Host and Origin are still checked.
        self.open_paths = open_paths
        self.token = settings.token.encode("utf-8") if settings.token else None
        self.tokens = [t.encode("utf-8") for t in (settings.token, settings.management_token) if t]
        self.max_body_bytes = settings.max_body_bytes
        self.allowed_hosts = {h.lower() for h in settings.allowed_hosts}
        if settings.host not in ("0.0.0.0", "::", ""):  # the address it listens on is a name clients use
            self.allowed_hosts.add(settings.host.strip("[]").lower())
        self.allowed_origins = {o.rstrip("/").lower() for o in settings.cors_origins}

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

    def host_allowed(self, host: str) -> bool:
        """``host`` as sent in a Host header or an Origin's netloc: name[:port]."""
        host = host.strip().lower()
        try:
            name = urlsplit(f"//{host}").hostname or ""
        except ValueError:  # e.g. an unbalanced IPv6 bracket
            return False
        return bool(name) and (is_loopback(name) or host in self.allowed_hosts or name in self.allowed_hosts)

    def _refuse(self, scope: Scope) -> tuple | None:
        host = _header(scope, b"host")
        if self.settings.checks_host and (host is None or not self.host_allowed(host)):
            return (421, "invalid_host", f"Host {host!r} is not allowed: use 127.0.0.1 or localhost, or add the name "
                    "to MCP_ALLOWED_HOSTS.")
        # Checked on every server: a token does not stop a foreign page when no token is set, and the
        # memory browser's page holds one.
        origin = _header(scope, b"origin")
        if origin is not None and not self._origin_allowed(origin, host or ""):
            return (403, "invalid_origin", f"Origin {origin!r} is not this server's: add it to MCP_CORS_ORIGINS to let "
                    "that web page use this server.")
        if self.token is None:
            if _remote_client(scope):
                return 401, "unauthorized", f"This server has no {TOKEN_ENV} set, so it only answers loopback clients."
            return None
        path = scope.get("path", "")
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in self.open_paths):
            return None
        header = (_header(scope, b"authorization") or "").strip()
        scheme, _, supplied = header.partition(" ")
        # Every token is compared, each with compare_digest: the time taken must not reveal which matched how far.
        matches = [hmac.compare_digest(supplied.strip().encode("utf-8"), token) for token in self.tokens]
        if scheme.lower() != "bearer" or not any(matches):
            return 401, "unauthorized", "Missing or wrong bearer token: send 'Authorization: Bearer <TINYCONTEXT_API_TOKEN>'."
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        """A configured CORS origin, or this server's own page: the Origin names the Host asked (already
        allowed). Another loopback port is another origin, as browsers count them."""
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc == host.strip().lower()

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


def protect(app, settings: ServeSettings, *, open_paths: tuple[str, ...] = ()) -> None:
    """Install the guard and the CORS policy on a Starlette/FastAPI ``app`` (before it starts).
    CORS is outermost so browser preflights (which carry no token) from configured origins work.
    ``open_paths``: static files that need no token (see :class:`Guard`)."""
    app.add_middleware(Guard, settings=settings, open_paths=open_paths)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=CORS_METHODS,
                           allow_headers=CORS_HEADERS, expose_headers=["Mcp-Session-Id"])

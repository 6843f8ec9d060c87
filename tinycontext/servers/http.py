"""Serving over the network: MCP over Streamable HTTP (or SSE) and the REST app, both behind the
guard of :mod:`tinycontext.servers.guard` (Host/Origin allow-list, bearer token, body cap, CORS).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Callable, Iterator

from starlette.types import ASGIApp

from ..config import TinyContextConfig
from ..errors import ConfigError, MissingExtraError, ModelMismatchError
from . import otel
from .guard import TRANSPORTS, ServeSettings, is_loopback, protect

__all__ = ["TRANSPORTS", "ServeSettings", "background", "mcp_app", "rest_app", "serve"]

# Seconds a stopping server waits for open streams (an MCP client's SSE GET) before cancelling them;
# under `docker stop`'s 10 s so the engines still close cleanly.
SHUTDOWN_GRACE_S = 5


class _SessionEndedFilter(logging.Filter):
    """Drops the SDK's traceback for a session's standalone SSE stream closed by the session's own end: in
    mcp 1.x a client's DELETE (every SDK client sends one when it closes) makes ``terminate()`` close that
    stream under its writer, which then logs ClosedResourceError with a traceback. That is how every
    session ends, not an error; any other error of the writer is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        import anyio

        return not (record.msg == "Error in standalone SSE writer" and record.exc_info is not None
                    and isinstance(record.exc_info[1], anyio.ClosedResourceError))


_SESSION_ENDED = _SessionEndedFilter()


def with_management(settings: ServeSettings, config: TinyContextConfig) -> ServeSettings:
    """``settings`` for serving ``config`` over HTTP: refused when management is on without access control
    (tinycontext.servers.manage.check_serving); the management token also passes the bearer check."""
    from .manage import check_serving

    check_serving(config)
    if config.management and config.management_token is not None:
        return replace(settings, management_token=config.management_token.get_secret_value())
    return settings


def mcp_app(settings: ServeSettings, config: TinyContextConfig | None = None) -> ASGIApp:
    """The MCP server (the same tools as stdio) as an ASGI app for ``settings.transport``."""
    from mcp.server.transport_security import TransportSecuritySettings

    from ..config import load_config
    from .health import add_health_route
    from .mcp_server import build_server, warm_up

    config = config or load_config()
    settings = with_management(settings, config)
    server = build_server(config)
    server.settings.max_request_body_size = settings.max_body_bytes
    add_health_route(server, config)
    # The guard checks Host and Origin for both apps (one policy); the SDK's own check would be a second one.
    server.settings.transport_security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.sse_app() if settings.transport == "sse" else server.streamable_http_app()
    logging.getLogger("mcp.server.streamable_http").addFilter(_SESSION_ENDED)  # once: the same object is not added twice
    # Open the engine (database and model) at server start, not in the first client's session, so
    # the first call is as fast as the tenth. A failure is logged and reported by the first tool call.
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(started):
        await warm_up(config)
        async with inner(started) as state:
            yield state

    app.router.lifespan_context = lifespan
    protect(app, settings)
    return app


def rest_app(settings: ServeSettings, config: TinyContextConfig | None = None) -> ASGIApp:
    try:
        from .fastapi_server import create_app
    except ImportError as exc:
        raise MissingExtraError(f"The REST API needs FastAPI ({exc.name} is missing): pip install 'tinycontext[server]'.") from exc

    return create_app(config, settings=settings if config is None else with_management(settings, config))


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


def serve(settings: ServeSettings, config: TinyContextConfig | None = None, *, rest: bool = False, log_level: str = "warning",
          on_started: Callable[[str], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM: MCP over ``settings.transport`` (sse or streamable-http) or, with
    ``rest``, the REST app. The stdio transport is the ``tinycontext mcp`` command's job.

    The engine opens before the port does, so a bad database, model or volume stops the server with
    its error instead of a listener that fails every call. On a stop signal uvicorn stops accepting,
    lets requests in flight finish (streams still open after ``SHUTDOWN_GRACE_S`` are cancelled),
    then the engines close, which checkpoints the WAL into the database file. ``on_started``: called
    with the base URL (the real port when ``settings.port`` is 0) once the server listens."""
    import sys

    import uvicorn

    from ..config import load_config
    from ..memory.engine import close_engines, get_engine

    settings.check_bind()
    if settings.transport == "stdio" and not rest:
        raise ConfigError("The stdio transport is not a network server: run `tinycontext mcp`.")
    config = config or load_config()
    settings = with_management(settings, config)  # before the engine opens: a refusal costs nothing
    otel.configure()
    try:
        engine = get_engine(config)
        try:
            _ = engine.embedder  # load the model now, so the first call is as fast as the tenth
        except ModelMismatchError as err:
            # Still served: get, delete, sessions and stats work; save and recall answer this error.
            print(f"warning: {err}", file=sys.stderr)
        app = rest_app(settings, config) if rest else mcp_app(settings, config)
        what = "REST API (docs at /docs)" if rest else f"MCP over {settings.transport} at /{'sse' if settings.transport == 'sse' else 'mcp'}"
        auth = "bearer token required" if settings.token else "no token (loopback only)"
        print(f"TinyContext {what} on http://{settings.host}:{settings.port}; {auth}. Ctrl-C to stop.", file=sys.stderr)
        server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                               server_header=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
        if on_started is not None:
            threading.Thread(target=_when_started, args=(server, settings.host, on_started), daemon=True).start()
        with _sigterm_returns():
            try:
                server.run()
            except SystemExit as exc:  # uvicorn exits this way when it cannot start, after logging why
                raise ConfigError(f"The server could not start on {settings.host}:{settings.port} (see the error above). "
                                  "If the port is in use, stop the other server or set MCP_PORT.") from exc
    finally:
        close_engines()
    print("TinyContext stopped: requests finished, database checkpointed and closed.", file=sys.stderr)


def _when_started(server, host: str, on_started: Callable[[str], None]) -> None:
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    on_started(f"http://{'[' + host + ']' if ':' in host else host}:{port}")


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

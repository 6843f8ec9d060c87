"""Fixtures for tests of outbound fetching: nothing may leave loopback, and a local HTTP server.

``loopback_only`` patches socket connects and name lookups so that any attempt to reach beyond
127.0.0.0/8 and ::1 (or to ask DNS about a name) fails the test, even if the code under test
swallows the exception. ``LocalServer`` serves handler functions on 127.0.0.1.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest
from loopback_guard import install


@pytest.fixture
def loopback_only(monkeypatch):
    violations: list[str] = []
    install(monkeypatch.setattr, violations)
    yield violations
    assert not violations, f"outbound traffic beyond loopback attempted: {violations}"


Handler = Callable[[BaseHTTPRequestHandler], None]


class LocalServer:
    """A threaded HTTP server on 127.0.0.1; ``routes`` maps a path to a function writing the response."""

    def __init__(self, routes: dict[str, Handler]):
        self.routes = routes
        self.requests: list[dict] = []
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                server.requests.append({"path": self.path, "headers": dict(self.headers)})
                route = server.routes.get(path)
                if route is None:
                    send(self, 404, b"not found", "text/plain")
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> "LocalServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "text/html; charset=utf-8",
         headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


def redirect(location: str, status: int = 302) -> Handler:
    return lambda h: send(h, status, b"", "text/plain", {"Location": location})

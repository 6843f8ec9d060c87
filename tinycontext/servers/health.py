"""Health: the ``GET /health`` answer both HTTP apps give, and a probe for container health checks.

``python -m tinycontext.servers.health`` asks the server in the same container (loopback,
``$MCP_PORT``, the bearer token from the environment) and exits 0 only when it answers
``status: ok``: the engine opened its database and model. Docker's ``HEALTHCHECK`` runs it.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..version import __version__
from ..config import TinyContextConfig
from ..memory.engine import MemoryEngine, get_engine
from ..errors import ConfigError, TinyContextError
from .guard import DEFAULT_PORT, read_token

if TYPE_CHECKING:
    from mcp.server.fastmcp import FastMCP


def health_report(engine: MemoryEngine) -> dict:
    _ = engine.embedder  # ready means able to save and recall: the model loads and fits the database
    stats = engine.stats()
    return {"status": "ok", "version": __version__, "memories": stats["memories"], "sessions": stats["sessions"],
            "embedder": (stats["embedder"] or {}).get("model")}


def add_health_route(server: FastMCP, config: TinyContextConfig) -> None:
    """``GET /health`` on the MCP app (behind the same token check): the REST app's answer, or 503
    with the engine's error while it cannot open its database or model."""

    @server.custom_route("/health", methods=["GET"], include_in_schema=False)
    async def health(_request: Request) -> JSONResponse:
        try:
            report = await anyio.to_thread.run_sync(lambda: health_report(get_engine(config)))
        except TinyContextError as err:
            return JSONResponse({"status": "error", **err.to_dict()}, status_code=503)
        return JSONResponse(report)


def probe(url: str, token: str | None, timeout: float = 5.0) -> tuple[bool, str]:
    """(healthy, what the server said) for ``url``; never raises."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback URL we build
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        return False, f"HTTP {err.code}: {err.read()[:500].decode('utf-8', 'replace')}"
    except (OSError, ValueError) as err:
        return False, f"{type(err).__name__}: {err}"
    return body.get("status") == "ok", json.dumps(body)


def main() -> int:
    try:
        token = read_token()
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 1
    healthy, said = probe(f"http://127.0.0.1:{os.environ.get('MCP_PORT') or DEFAULT_PORT}/health", token)
    print(said, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())

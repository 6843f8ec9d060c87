"""Protocol adapters over the library: the MCP server (:mod:`.mcp_server`, stdio and streamable HTTP),
the REST API (:mod:`.fastapi_server`), their tool groups (memory browsing, web, browser), the HTTP
guard and health checks."""

from ..errors import MissingExtraError

try:  # the mcp extra: a core install says which pip command brings it
    import anyio, mcp  # noqa: F401, E401
except ImportError as exc:
    raise MissingExtraError(f"The MCP server needs {exc.name}: pip install 'tinycontext[mcp]' ('tinycontext[server]' for HTTP)") from exc

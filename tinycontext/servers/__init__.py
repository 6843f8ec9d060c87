"""Protocol adapters over the library: the MCP server (:mod:`.mcp_server`, stdio and streamable HTTP),
the REST API (:mod:`.fastapi_server`), their tool groups (memory browsing, web, browser), the HTTP
guard and health checks."""

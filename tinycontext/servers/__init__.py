"""Protocol adapters over the engine: the MCP server (stdio here; streamable HTTP reuses its tools)."""

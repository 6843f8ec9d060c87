"""The MCP result of a failed tool call, shared by every tool group (memory, browse, web, browser)."""

from __future__ import annotations

from mcp.types import CallToolResult, TextContent

from ..errors import TinyContextError


def error_result(err: TinyContextError) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=str(err))], structuredContent={"error": err.to_dict()}, isError=True)

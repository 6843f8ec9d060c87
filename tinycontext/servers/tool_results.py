"""The MCP result of a failed tool call: ``isError`` with the text ``code: message`` and no structured content
(the TypeScript SDK checks structured content against the tool's success ``outputSchema``, errors included)."""

from __future__ import annotations

from mcp.types import CallToolResult, TextContent

from ..errors import TinyContextError


def error_result(err: TinyContextError) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=str(err))], isError=True)

"""The MCP server: five memory tools over the engine, built with the official SDK's FastMCP.

``build_server`` holds every tool definition so the stdio command (``tinycontext mcp``) and the
streamable HTTP server serve the same tools. Each tool answers twice: a compact text rendering for
the model (it pays for every character) and the full result dict as structured content for
programs. Errors are tool results with ``isError`` set whose text starts with the error code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from ..config import TinyContextConfig, load_config
from ..engine import MemoryEngine, MemoryInput, get_engine
from ..errors import InvalidInputError, TinyContextError
from ..web.browser.tools import register as register_browser

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Long-term memory that persists across conversations. Call recall_memories before answering "
    "anything that may depend on earlier conversations, the user's preferences, projects or past "
    "decisions. Call save_memories when you learn a durable fact worth keeping (a preference, a "
    "decision and its reason, a convention, a correction), one concise self-contained fact per memory. "
    "Fix outdated facts with update_memory rather than saving a contradicting one."
)

# Argument types shared by several tools (module level: FastMCP evaluates the annotations).
Session = Annotated[str | None, Field(description="Session (namespace) name, e.g. a project. Omit for 'default'.")]
MemoryId = Annotated[int, Field(description="Memory id, as shown by recall_memories (id N).")]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def render_memory_line(memory: dict, *, with_session: bool = False) -> str:
    """``- content (YYYY-MM-DD; tags: a, b; id 12)``: one memory on one line for a model to read."""
    facts = [memory["updated_at"][:10]]
    if memory["tags"]:
        facts.append("tags: " + ", ".join(memory["tags"]))
    if with_session:
        facts.append(f"session {memory['session_id']}")
    facts.append(f"id {memory['id']}")
    return f"- {_one_line(memory['content'])} ({'; '.join(facts)})"


def render_recall(result: dict) -> str:
    memories = result["memories"]
    if not memories and not result["omitted"]:
        return "No matching memories."
    # Name sessions only when an unfiltered recall found memories from more than one.
    with_session = result["session_id"] is None and len({m["session_id"] for m in memories}) > 1
    lines = [render_memory_line(m, with_session=with_session) for m in memories]
    if result["omitted"]:
        lines.append(f"({len(result['omitted'])} more matched but did not fit max_tokens={result['max_tokens']}; "
                     f"raise max_tokens to see them.)")
    if result["next_offset"] is not None:
        lines.append(f"(More results: call again with offset={result['next_offset']}.)")
    return "\n".join(lines)


def render_save(result: dict) -> str:
    parts = [f"Saved {len(result['ids'])} in session {result['session_id']}"
             + (f": ids {', '.join(map(str, result['ids']))}." if result["ids"] else ".")]
    for skip in result["skipped"]:
        target = skip.get("duplicate_of", skip.get("similar_to"))
        parts.append(f"Skipped memories[{skip['index']}]: {skip['reason'].replace('_', ' ')} of id {target}.")
    for near in result["near_duplicates"]:
        parts.append(f"memories[{near['index']}] is similar to id {near['similar_to']} "
                     f"(cosine {near['similarity']}); if it restates that memory, update_memory it instead.")
    return "\n".join(parts)


def render_memory(memory: dict) -> str:
    lines = [render_memory_line(memory, with_session=True) + f" v{memory['version']}"]
    if memory["metadata"]:
        lines.append(f"metadata: {memory['metadata']}")
    for old in memory.get("history", []):
        lines.append(f"v{old['version']} until {old['superseded_at'][:10]}: {_one_line(old['content'])}")
    return "\n".join(lines)


def error_result(err: TinyContextError) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=str(err))], structuredContent={"error": err.to_dict()}, isError=True)


def _validation_summary(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())


class TinyContextMCP(FastMCP):
    """FastMCP whose failures also start with an error code.

    FastMCP validates arguments before our tool runs and wraps anything raised as "Error executing
    tool ...". Argument errors become ``invalid_input``; anything unexpected ``internal_error``.
    """

    async def call_tool(self, name: str, arguments: dict[str, Any]):
        try:
            return await super().call_tool(name, arguments)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(str(InvalidInputError(f"{name}: {_validation_summary(cause)}"))) from cause
            if cause is None:  # e.g. an unknown tool name
                raise ToolError(str(InvalidInputError(str(exc)))) from exc
            log.error("tool %s failed", name, exc_info=cause)
            raise ToolError(f"internal_error: {type(cause).__name__}: {cause}") from cause


def build_server(config: TinyContextConfig | None = None) -> FastMCP:
    """The TinyContext MCP server for ``config`` (``load_config()`` when None); not yet running."""
    config = config or load_config()

    @asynccontextmanager
    async def warm_up(_server):
        # Load the model while the client initializes; a failure here is reported by the first tool call.
        async def open_engine():
            try:
                await anyio.to_thread.run_sync(get_engine, config)
            except TinyContextError as err:
                log.warning("engine not ready: %s", err)

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_engine)
            yield None

    server = TinyContextMCP("tinycontext", instructions=INSTRUCTIONS, log_level="WARNING", lifespan=warm_up)

    async def answer(work: Callable[[MemoryEngine], dict], render: Callable[[dict], str]) -> CallToolResult:
        # Engine calls block (ONNX, SQLite): run them on a worker thread, off the event loop.
        try:
            result = await anyio.to_thread.run_sync(lambda: work(get_engine(config)))
        except TinyContextError as err:
            return error_result(err)
        return CallToolResult(content=[TextContent(type="text", text=render(result))], structuredContent=result)

    @server.tool(
        description=(
            "Save durable facts to long-term memory: user preferences, decisions and their reasons, project "
            "conventions, names, commitments, corrections. Write each memory as one concise, self-contained fact "
            "that will make sense later without this conversation (e.g. 'User prefers pnpm over npm for JS "
            "projects'). Batch several facts in one call. Do not save chit-chat, temporary state, things easy to "
            "look up again, or secrets (passwords, API keys). Exact repeats are skipped; near-duplicates are "
            "reported, in which case prefer update_memory on the existing id."
        ),
        annotations=ToolAnnotations(title="Save memories", readOnlyHint=False, destructiveHint=False, openWorldHint=False),
    )
    async def save_memories(
        memories: Annotated[list[MemoryInput], Field(description="Memories to save: {content, tags?, metadata?} each.")],
        session_id: Session = None,
    ) -> CallToolResult:
        return await answer(lambda engine: engine.save(memories, session_id=session_id), render_save)

    @server.tool(
        description=(
            "Search long-term memory. Call it before answering anything that may depend on earlier conversations or "
            "on the user's preferences, projects or past decisions, and before saving, to avoid duplicates. Use a "
            "natural-language question or keywords. Returns the best matches first, one per line with date, tags "
            f"and id, within max_tokens (default {config.recall_max_tokens}) and top_k (default {config.recall_top_k}). "
            "If the answer ends with an offset hint, call again with that offset for more."
        ),
        annotations=ToolAnnotations(title="Recall memories", readOnlyHint=True, openWorldHint=False),
    )
    async def recall_memories(
        query: Annotated[str, Field(description="What to remember: a question or keywords.")],
        session_id: Annotated[str | None, Field(description="Search only this session; omit to search all.")] = None,
        max_tokens: Annotated[int | None, Field(description="Token budget for the memories returned (1-1000000).")] = None,
        top_k: Annotated[int | None, Field(description="At most this many memories (1-1000).")] = None,
        tags: Annotated[list[str] | None, Field(description="Keep only memories with any of these tags.")] = None,
        offset: Annotated[int, Field(description="Skip this many ranked results (paging).")] = 0,
    ) -> CallToolResult:
        return await answer(
            lambda engine: engine.recall(query, session_id=session_id, max_tokens=max_tokens, top_k=top_k, tags=tags, offset=offset),
            render_recall,
        )

    @server.tool(
        description=(
            "Correct or refine a saved memory when a fact has changed, instead of saving a contradicting one. "
            "Only the fields you pass change; tags and metadata are replaced as a whole. The previous version "
            "stays in the memory's history (see get_memory)."
        ),
        annotations=ToolAnnotations(title="Update a memory", readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False),
    )
    async def update_memory(
        id: MemoryId,
        content: Annotated[str | None, Field(description="New text of the memory.")] = None,
        tags: Annotated[list[str] | None, Field(description="New tags (replace the old ones).")] = None,
        metadata: Annotated[dict[str, Any] | None, Field(description="New metadata object (replaces the old one).")] = None,
    ) -> CallToolResult:
        return await answer(lambda engine: engine.update(id, content, tags=tags, metadata=metadata), render_memory)

    @server.tool(
        description="Delete a memory that is wrong or that the user asked you to forget. Permanent, history included.",
        annotations=ToolAnnotations(title="Delete a memory", readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
    )
    async def delete_memory(id: MemoryId) -> CallToolResult:
        return await answer(lambda engine: engine.delete(id), lambda result: f"Deleted id {result['id']}.")

    @server.tool(
        description="Fetch one memory by id with its metadata and edit history (earlier versions).",
        annotations=ToolAnnotations(title="Get a memory", readOnlyHint=True, openWorldHint=False),
    )
    async def get_memory(id: MemoryId) -> CallToolResult:
        return await answer(lambda engine: engine.get(id), render_memory)

    register_browser(server, config)
    return server

"""The MCP server: five memory tools over the engine, built with the official SDK's FastMCP.

``build_server`` holds every tool definition so the stdio command (``tinycontext mcp``) and the
streamable HTTP server serve the same tools. Each tool answers twice: a compact text rendering for
the model and the result as structured content. Recall's two answers are fitted together to
``max_tokens`` (tinycontext.budget.render). Errors are tool results with ``isError`` set whose text starts
with the error code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from ..memory import keyword_mode as keyword
from ..config import TinyContextConfig, load_config
from ..memory.engine import MemoryEngine, MemoryInput, get_engine
from . import web_tools
from ..errors import InvalidInputError, TinyContextError
from ..retrieval.filters import FilterSpec
from ..budget.render import DETAILS, MIN_AGENT_TOKENS, Page, memory_block
from .browser_tools import register as register_browser
from . import browse_tools as browse
from .mcp_schemas import output_schemas
from .tool_results import error_result

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Long-term memory that persists across conversations. Call recall_memories before answering "
    "anything that may depend on earlier conversations, the user's preferences, projects or past "
    "decisions. Call save_memories when you learn a durable fact worth keeping (a preference, a "
    "decision and its reason, a convention, a correction), one concise self-contained fact per memory. "
    "Fix outdated facts with update_memory rather than saving a contradicting one. Use list_memories to "
    "browse without a query, delete_memories (a dry run first) when the user asks to forget a topic or "
    "project; the resources tinycontext://sessions and tinycontext://stats describe what is stored."
)

# Argument types shared by several tools (module level: FastMCP evaluates the annotations).
Session = Annotated[str | None, Field(description="Session (namespace) name, e.g. a project. Omit for 'default'.")]
MemoryId = Annotated[int, Field(description="Memory id, as shown by recall_memories (id N).")]


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


def _validation_summary(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())


class TinyContextMCP(FastMCP):
    """FastMCP whose failures also start with an error code.

    FastMCP validates arguments before our tool runs and wraps anything raised as "Error executing
    tool ...". Argument errors become ``invalid_input``; anything unexpected ``internal_error``.
    Tools return ``CallToolResult`` themselves (text and structured content as budgeted), so their
    ``outputSchema`` comes from ``output_schemas`` (tool name -> JSON schema) when tools are listed.
    """

    output_schemas: dict[str, dict] = {}

    async def list_tools(self):
        tools = await super().list_tools()
        return [tool.model_copy(update={"outputSchema": self.output_schemas[tool.name]})
                if tool.outputSchema is None and tool.name in self.output_schemas else tool for tool in tools]

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


async def warm_up(config: TinyContextConfig) -> None:
    """Open the shared engine for ``config`` and load its model off the event loop; log a failure
    (calls that need the model report it; get, delete, sessions and stats work without it)."""
    try:
        await anyio.to_thread.run_sync(lambda: get_engine(config).embedder)
    except TinyContextError as err:
        log.warning("engine not ready: %s", err)


def build_server(config: TinyContextConfig | None = None) -> FastMCP:
    """The TinyContext MCP server for ``config`` (``load_config()`` when None); not yet running."""
    config = config or load_config()

    @asynccontextmanager
    async def lifespan(_server):
        # Load the model while the client initializes; a failure here is reported by the first tool call.
        async with anyio.create_task_group() as tg:
            tg.start_soon(warm_up, config)
            yield None

    server = TinyContextMCP("tinycontext", instructions=INSTRUCTIONS + keyword.instructions_note(config), log_level="WARNING", lifespan=lifespan)

    async def answer(work: Callable[[MemoryEngine], dict], render: Callable[[dict], str]) -> CallToolResult:
        # Engine calls block (ONNX, SQLite): run them on a worker thread, off the event loop.
        try:
            result = await anyio.to_thread.run_sync(lambda: work(get_engine(config)))
        except TinyContextError as err:
            return error_result(err)
        return CallToolResult(content=[TextContent(type="text", text=render(result))], structuredContent=result)

    async def answer_page(work: Callable[[MemoryEngine], Page]) -> CallToolResult:
        """An answer fitted to its budget: the text and structured content exactly as counted."""
        try:
            page = await anyio.to_thread.run_sync(lambda: work(get_engine(config)))
        except TinyContextError as err:
            return error_result(err)
        return CallToolResult(content=[TextContent(type="text", text=page.text)], structuredContent=page.structured)

    @server.tool(
        description=(
            "Save durable facts to long-term memory: user preferences, decisions and their reasons, project "
            "conventions, names, commitments, corrections. Write each memory as one concise, self-contained fact "
            "that will make sense later without this conversation (e.g. 'User prefers pnpm over npm for JS "
            "projects'). Batch several facts in one call. Do not save chit-chat, temporary state, things easy to "
            "look up again, or secrets (passwords, API keys). Exact repeats are skipped; near-duplicates are "
            "reported, in which case prefer update_memory on the existing id. To keep a conversation, save each chat "
            "session in one call, one turn per memory with speaker and occurred_at (and attachments: captions of "
            "shared images); the call's turns form one episode."
        ),
        annotations=ToolAnnotations(title="Save memories", readOnlyHint=False, destructiveHint=False, openWorldHint=False),
    )
    async def save_memories(
        memories: Annotated[list[MemoryInput], Field(description="Memories to save: {content, tags?, metadata?, speaker?, "
                                                                 "occurred_at?, attachments?, episode?} each.")],
        session_id: Session = None,
        episode: Annotated[str | None, Field(description="Episode key for memories that name none (e.g. a thread id).")] = None,
    ) -> CallToolResult:
        return await answer(lambda engine: engine.save(memories, session_id=session_id, episode=episode), render_save)

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
        max_tokens: Annotated[int | None, Field(description=f"Token budget for this whole answer ({MIN_AGENT_TOKENS}-1000000).")] = None,
        top_k: Annotated[int | None, Field(description="At most this many memories (1-1000).")] = None,
        tags: Annotated[list[str] | None, Field(description="Keep only memories with any of these tags.")] = None,
        offset: Annotated[int, Field(description="Skip this many ranked results (paging).")] = 0,
        detail: Annotated[Literal[DETAILS], Field(description="compact: id, rank, content, tags, date; full: also "
                                                   "session, metadata, version, timestamps, scores (fewer fit).")] = "compact",
        filters: Annotated[FilterSpec | None, Field(description="Narrow the search: tags_any, tags_all, metadata equality, "
                                                    "created_at/updated_at ranges ({gte, gt, lte, lt}).")] = None,
    ) -> CallToolResult:
        return await answer_page(lambda engine: engine.recall_rendered(
            query, session_id=session_id, max_tokens=max_tokens, top_k=top_k, tags=tags, offset=offset, detail=detail,
            filters=filters))

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
        expected_version: Annotated[int | None, Field(description="Only update if the memory is still at this version "
                                                      "(from get_memory); otherwise a conflict error and nothing changes.")] = None,
    ) -> CallToolResult:
        return await answer(lambda engine: engine.update(id, content, tags=tags, metadata=metadata, expected_version=expected_version),
                            memory_block)

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
        return await answer(lambda engine: engine.get(id), memory_block)

    web_tools.register(server, config, engine=lambda: get_engine(config))
    register_browser(server, config)
    browse.register(server, config)
    server.output_schemas = output_schemas()
    return server

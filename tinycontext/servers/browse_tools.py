"""Browsing and housekeeping over MCP (``register``) and REST (``router``): thin adapters over
:mod:`tinycontext.memory.browse` through the engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from ..memory.browse import MAX_LIST_LIMIT, ORDERS
from ..config import TinyContextConfig
from ..memory.engine import MemoryEngine, get_engine
from .tool_results import error_result
from ..errors import TinyContextError
from ..retrieval.filters import FilterSpec
from ..budget.render import DETAILS, Page, plural, to_json

Order = Literal[tuple(ORDERS)]  # type: ignore[valid-type]
FILTERS_HELP = "tags_any, tags_all, metadata equality, created_at/updated_at ranges ({gte, gt, lte, lt})."


def render_sessions(result: dict) -> str:
    if not result["sessions"]:
        return "No sessions yet."
    return "\n".join(f"- {s['session_id']}: {plural(s['memories'], 'memory', 'memories')}, {plural(s['tokens'], 'token')}, since {s['created_at'][:10]}"
                     for s in result["sessions"])


def render_delete(result: dict) -> str:
    if result["dry_run"]:
        return f"{plural(result['matched'], 'memory', 'memories')} match{'es' if result['matched'] == 1 else ''}; nothing deleted. {result['next']}"
    return f"Deleted {plural(result['deleted'], 'memory', 'memories')}."


def register(server, config: TinyContextConfig) -> None:
    """Add list_memories, list_sessions and delete_memories to the MCP ``server``."""

    async def run(work: Callable[[MemoryEngine], Any]):
        return await anyio.to_thread.run_sync(lambda: work(get_engine(config)))

    async def answer(work: Callable[[MemoryEngine], dict], render: Callable[[dict], str]) -> CallToolResult:
        try:
            result = await run(work)
        except TinyContextError as err:
            return error_result(err)
        return CallToolResult(content=[TextContent(type="text", text=render(result))], structuredContent=result)

    async def answer_page(work: Callable[[MemoryEngine], Page]) -> CallToolResult:
        try:
            page = await run(work)
        except TinyContextError as err:
            return error_result(err)
        return CallToolResult(content=[TextContent(type="text", text=page.text)], structuredContent=page.structured)

    @server.resource("tinycontext://sessions", name="sessions", mime_type="application/json",
                     description="Memory sessions with their memory and token counts.")
    async def sessions_resource() -> str:
        return to_json(await run(lambda engine: engine.list_sessions()))

    @server.resource("tinycontext://stats", name="stats", mime_type="application/json",
                     description="Database statistics: memories, tokens, vectors, sessions, schema, embedder, search mode.")
    async def stats_resource() -> str:
        return to_json(await run(lambda engine: {**engine.stats(), "search_mode": engine.search_mode}))

    @server.tool(
        description=(
            "Browse memories without a query, newest first by default: one compact line each, within max_tokens. "
            "Use it to review what is stored (e.g. a session's memories, everything tagged X, last week's). "
            "Follow the offset hint at the end for the next page. To search by meaning use recall_memories."
        ),
        annotations=ToolAnnotations(title="List memories", readOnlyHint=True, openWorldHint=False),
    )
    async def list_memories(
        session_id: Annotated[str | None, Field(description="Only this session; omit for all.")] = None,
        tags: Annotated[list[str] | None, Field(description="Only memories with any of these tags.")] = None,
        filters: Annotated[FilterSpec | None, Field(description=FILTERS_HELP)] = None,
        order: Annotated[Order, Field(description="newest (last changed first), oldest (saved first) or id.")] = "newest",
        offset: Annotated[int, Field(description="Skip this many (paging).")] = 0,
        limit: Annotated[int, Field(description=f"At most this many (1-{MAX_LIST_LIMIT}).")] = 50,
        max_tokens: Annotated[int | None, Field(description="Token budget for the answer.")] = None,
        detail: Annotated[Literal[DETAILS], Field(description="compact or full (session, metadata, version).")] = "compact",
    ) -> CallToolResult:
        return await answer_page(lambda engine: engine.list_memories(
            session_id=session_id, tags=tags, filters=filters, order=order, offset=offset, limit=limit,
            max_tokens=max_tokens, detail=detail))

    @server.tool(
        description="List the memory sessions (namespaces) with how many memories and tokens each holds.",
        annotations=ToolAnnotations(title="List sessions", readOnlyHint=True, openWorldHint=False),
    )
    async def list_sessions() -> CallToolResult:
        return await answer(lambda engine: engine.list_sessions(), render_sessions)

    @server.tool(
        description=(
            "Delete every memory of a session, with any of some tags, or matching filters, e.g. when the user asks to "
            "forget a project. Always call it first with dry_run=true (the default) to learn how many match, tell the "
            "user, then call with dry_run=false and confirm=<that count>. Permanent."
        ),
        annotations=ToolAnnotations(title="Delete memories in bulk", readOnlyHint=False, destructiveHint=True, openWorldHint=False),
    )
    async def delete_memories(
        session_id: Annotated[str | None, Field(description="Delete this session's memories.")] = None,
        tags: Annotated[list[str] | None, Field(description="Delete memories with any of these tags.")] = None,
        filters: Annotated[FilterSpec | None, Field(description=FILTERS_HELP)] = None,
        dry_run: Annotated[bool, Field(description="Only count the matches (default).")] = True,
        confirm: Annotated[int | None, Field(description="The count the dry run reported; required to delete.")] = None,
    ) -> CallToolResult:
        return await answer(lambda engine: engine.delete_memories(
            session_id=session_id, tags=tags, filters=filters, dry_run=dry_run, confirm=confirm), render_delete)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ListRequest(_Request):
    session_id: str | None = Field(None, description="Only this session; omit for all.")
    tags: list[str] | None = Field(None, description="Only memories with any of these tags.")
    filters: FilterSpec | None = Field(None, description=FILTERS_HELP)
    order: Order = Field("newest", description="newest, oldest or id.")
    offset: int = Field(0, description="Skip this many (paging).")
    limit: int = Field(50, description=f"At most this many (1-{MAX_LIST_LIMIT}).")
    max_tokens: int | None = Field(None, description="Token budget for the answer.")
    detail: Literal[DETAILS] = Field("compact", description="compact or full.")  # type: ignore[valid-type]


class DeleteManyRequest(_Request):
    session_id: str | None = Field(None, description="Delete this session's memories.")
    tags: list[str] | None = Field(None, description="Delete memories with any of these tags.")
    filters: FilterSpec | None = Field(None, description=FILTERS_HELP)
    dry_run: bool = Field(True, description="Only count the matches (default).")
    confirm: int | None = Field(None, description="The count the dry run reported; required to delete.")


def router(engines: Callable[[], MemoryEngine]):
    """REST endpoints: POST /list_memories, GET /sessions, POST /delete_memories."""
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse

    api = APIRouter()

    @api.post("/list_memories", summary="Browse memories (newest first by default) within a token budget")
    def list_memories(body: ListRequest):
        page = engines().list_memories(**body.model_dump(exclude={"filters"}), filters=body.filters)
        return JSONResponse(page.structured)

    @api.get("/sessions", summary="Sessions with their memory and token counts")
    def list_sessions():
        return engines().list_sessions()

    @api.post("/delete_memories", summary="Delete by session, tags or filters: a dry run first, then confirm its count")
    def delete_memories(body: DeleteManyRequest):
        return engines().delete_memories(**body.model_dump(exclude={"filters"}), filters=body.filters)

    return api

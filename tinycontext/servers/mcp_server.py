"""The MCP server: the tools of :mod:`tinycontext.servers.tools` over the engine, web and browser, built
on the official SDK's FastMCP.

``build_server`` lists the tools of the capabilities the ``tools`` setting turns on, so the stdio
command (``tinycontext mcp``) and the HTTP server serve the same ones. A tool's arguments are checked
by its strict request model (the REST app uses the same); each answer is a compact text rendering for
the model plus the result as structured content, which matches the tool's ``outputSchema``. Recall's
two answers are fitted together to ``max_tokens`` (tinycontext.render). An error is a result with
``isError`` set, text ``code: message`` (the message says what to do) and no structured content,
which every client accepts: the TypeScript SDK checks any structured content against the success
schema, even on errors.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations
from pydantic import BaseModel, ValidationError

from ..budget.render import Page, memory_block, plural, to_json
from ..activity import ActivityLog, open_activity
from ..config import TinyContextConfig, load_config
from ..errors import InvalidInputError, TinyContextError
from ..memory import keyword_mode as keyword
from ..memory.engine import MemoryEngine, get_engine
from ..web.clock import current_datetime, render_datetime
from . import manage, tools
from .activity import Caller, caller_of_request, error_code, record
from .mcp_schemas import output_schemas
from .tool_results import error_result
from .web import engine_embedder, split_answer

log = logging.getLogger(__name__)

Handler = Callable[[BaseModel], Awaitable[CallToolResult]]
JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array", "dict": "object",
              "NoneType": "null"}


def instructions(listed: set[str]) -> str:
    """What the server tells a client at start: when to use the tools it lists."""
    parts = ["Long-term memory that persists across conversations. Call recall_memories before answering anything "
             "that may depend on earlier conversations, the user's preferences, projects or past decisions. Call "
             "save_memories when you learn a durable fact worth keeping, one concise self-contained fact per memory."]
    if "update_memory" in listed:
        parts.append("Fix outdated facts with update_memory rather than saving a contradicting one; delete_memories "
                     "(a dry run first) when the user asks to forget a topic or project.")
    if "search" in listed:
        parts.append("For facts from the web, search, then scrape_urls the promising pages.")
    return " ".join(parts)


def render_save(result: dict, *, can_update: bool) -> str:
    parts = [f"Saved {len(result['ids'])} in session {result['session_id']}"
             + (f": ids {', '.join(map(str, result['ids']))}." if result["ids"] else ".")]
    for skip in result["skipped"]:
        target = skip.get("duplicate_of", skip.get("similar_to"))
        parts.append(f"Skipped memories[{skip['index']}]: {skip['reason'].replace('_', ' ')} of id {target}.")
    advice = "; if it restates that memory, update_memory it instead" if can_update else ""
    for near in result["near_duplicates"]:
        parts.append(f"memories[{near['index']}] is similar to id {near['similar_to']} (cosine {near['similarity']}){advice}.")
    for done in result.get("saved", []) + result["skipped"]:
        if done.get("supersedes"):
            parts.append(f"memories[{done['index']}] supersedes id {done['supersedes']}.")
    for candidate in result.get("supersession_candidates", []):
        parts.append(f"memories[{candidate['index']}] may replace id {candidate['supersedes']} ({', '.join(candidate['was'])} -> "
                     f"{', '.join(candidate['now'])}): if so, save it again with supersedes {candidate['supersedes']}.")
    return "\n".join(parts)


def render_sessions(result: dict) -> str:
    if not result["sessions"]:
        return "No sessions yet."
    return "\n".join(f"- {s['session_id']}: {plural(s['memories'], 'memory', 'memories')}, {plural(s['tokens'], 'token')}, "
                     f"since {s['created_at'][:10]}" for s in result["sessions"])


def render_delete(result: dict) -> str:
    if result["dry_run"]:
        return (f"{plural(result['matched'], 'memory', 'memories')} match{'es' if result['matched'] == 1 else ''}; "
                f"nothing deleted. {result['next']}")
    return f"Deleted {plural(result['deleted'], 'memory', 'memories')}."


def text_result(text: str, structured: dict) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structuredContent=structured)


def _got(value: Any) -> str:
    kind = JSON_TYPES.get(type(value).__name__, type(value).__name__)
    return f"{kind} {value!r:.40}" if isinstance(value, (str, int, float, bool)) else kind


def argument_error(spec: tools.ToolSpec, exc: ValidationError) -> InvalidInputError:
    """One line per wrong argument, then what the tool takes: enough for a model to fix its call."""
    parts = []
    for e in exc.errors()[:5]:
        where = ".".join(map(str, e["loc"])) or "arguments"
        if e["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown argument")
        elif e["type"] == "missing":
            parts.append(f"{where}: required")
        else:
            parts.append(f"{where}: {e['msg'].rstrip('.')}, got {_got(e['input'])}")
    more = f" (and {len(exc.errors()) - 5} more)" if len(exc.errors()) > 5 else ""
    takes = ", ".join(f"{n}{' (required)' if n in spec.required else ''}" for n in spec.request.model_fields) or "no arguments"
    return InvalidInputError(f"{spec.name}: {'; '.join(parts)}{more}. Fix the arguments and call again; it takes {takes}.")


class TinyContextMCP(FastMCP):
    """FastMCP serving :class:`tools.ToolSpec` tools: their hand-written schemas are what ``tools/list``
    shows, their request models check the arguments, and every failure is a result that starts with an
    error code. Tools registered the FastMCP way (``@server.tool``) still work beside them."""

    def __init__(self, *args, engine_config: TinyContextConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.specs: dict[str, tuple[tools.ToolSpec, Handler]] = {}
        self.output_schemas: dict[str, dict] = {}
        self.engine_config = engine_config or TinyContextConfig()
        # Set when activity records are on: every listed tool's call is recorded here, in call_tool.
        self.activity: ActivityLog | None = None

    def caller(self) -> Caller:
        """Who sent the request being handled: the operator on stdio, else from the HTTP request."""
        try:
            request = self._mcp_server.request_context.request
        except LookupError:
            request = None
        return caller_of_request(self.engine_config, request)

    def offer(self, spec: tools.ToolSpec, handler: Handler) -> None:
        self.specs[spec.name] = (spec, handler)

    async def list_tools(self) -> list[Tool]:
        listed = [Tool(name=spec.name, description=spec.description, inputSchema=spec.input_schema,
                       outputSchema=self.output_schemas.get(spec.name),
                       annotations=ToolAnnotations(title=spec.title, readOnlyHint=spec.read_only,
                                                   destructiveHint=spec.destructive, idempotentHint=spec.idempotent,
                                                   openWorldHint=spec.open_world))
                  for spec, _ in self.specs.values()]
        return listed + await super().list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any]):
        if self.activity is None or name not in self.specs:
            return await self._call_tool(name, arguments)
        started = time.perf_counter()
        result = await self._call_tool(name, arguments)
        shown = "\n".join(c.text for c in result.content if isinstance(c, TextContent))
        await record(self.activity, self.caller(), name, outcome=error_code(shown) if result.isError else "ok",
                     started=started, request=arguments, answer=result.structuredContent, shown=shown)
        return result

    async def _call_tool(self, name: str, arguments: dict[str, Any]):
        if name in self.specs:
            spec, handler = self.specs[name]
            try:
                request = spec.request.model_validate(arguments or {})
            except ValidationError as exc:
                return error_result(argument_error(spec, exc))
            try:
                return await handler(request)
            except TinyContextError as err:
                return error_result(err)
            except Exception as exc:  # noqa: BLE001 - a bug answers with its code, the log has the trace
                log.error("tool %s failed", name, exc_info=exc)
                return error_result(TinyContextError(f"{type(exc).__name__}: {exc}. This is a bug; the server log has the details."))
        try:
            return await super().call_tool(name, arguments)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(str(InvalidInputError(f"{name}: {cause.errors()[0]['msg']}"))) from cause
            if cause is None:  # e.g. an unknown tool name
                known = ", ".join(self.specs) or "none"
                raise ToolError(str(InvalidInputError(f"{exc}. This server lists {known}; the tools setting turns on "
                                                      "others (memory, manage, web, browser or all)."))) from exc
            log.error("tool %s failed", name, exc_info=cause)
            raise ToolError(f"internal_error: {type(cause).__name__}: {cause}") from cause


async def warm_up(config: TinyContextConfig) -> None:
    """Open the shared engine for ``config`` and load its model off the event loop; log a failure
    (calls that need the model report it; get, delete, sessions and stats work without it)."""
    try:
        await anyio.to_thread.run_sync(lambda: get_engine(config).embedder)
    except TinyContextError as err:
        log.warning("engine not ready: %s", err)


def build_server(config: TinyContextConfig | None = None) -> TinyContextMCP:
    """The TinyContext MCP server for ``config`` (``load_config()`` when None); not yet running."""
    config = config or load_config()
    offered = {spec.name: spec for spec in tools.active(config)}

    @asynccontextmanager
    async def lifespan(_server):
        # Load the model while the client initializes; a failure here is reported by the first tool call.
        async with anyio.create_task_group() as tg:
            tg.start_soon(warm_up, config)
            yield None

    server = TinyContextMCP("tinycontext", instructions=instructions(set(offered)) + keyword.instructions_note(config),
                            log_level="WARNING", lifespan=lifespan, engine_config=config)
    server.activity = open_activity(config)

    async def run(work: Callable[[MemoryEngine], Any]) -> Any:
        # Engine calls block (ONNX, SQLite): run them on a worker thread, off the event loop.
        return await anyio.to_thread.run_sync(lambda: work(get_engine(config)))

    def tool(name: str, render: Callable[[dict], str] | None = None):
        """Register the handler below for ``name`` when the profile lists it. With ``render`` the handler's
        dict is the structured content and ``render`` its text; without, the handler returns a Page."""
        def register(work: Callable[[Any], Awaitable[Any]]):
            if name not in offered:
                return work

            async def handler(request):
                result = await work(request)
                if isinstance(result, Page):
                    return text_result(result.text, result.structured)
                return text_result(render(result), result) if render else result

            server.offer(offered[name], handler)
            return work
        return register

    can_update = "update_memory" in offered

    @tool("save_memories", lambda result: render_save(result, can_update=can_update))
    async def save(r: tools.SaveRequest):
        return await run(lambda engine: engine.save(r.memories, session_id=r.session_id, episode=r.episode))

    @tool("recall_memories")
    async def recall(r: tools.RecallRequest):
        return await run(lambda engine: engine.recall_rendered(
            r.query, session_id=r.session_id, max_tokens=r.max_tokens, top_k=r.top_k, tags=r.tags, offset=r.offset,
            detail=r.detail, filters=r.filters, include_superseded=r.include_superseded))

    @tool("get_memory", memory_block)
    async def get(r: tools.IdRequest):
        return await run(lambda engine: engine.get(r.id))

    @tool("update_memory", memory_block)
    async def update(r: tools.UpdateRequest):
        return await run(lambda engine: engine.update(r.id, r.content, tags=r.tags, metadata=r.metadata,
                                                      expected_version=r.expected_version))

    @tool("delete_memory", lambda result: f"Deleted id {result['id']}.")
    async def delete(r: tools.IdRequest):
        return await run(lambda engine: engine.delete(r.id))

    @tool("list_memories")
    async def list_memories(r: tools.ListRequest):
        return await run(lambda engine: engine.list_memories(**r.model_dump(exclude={"filters"}), filters=r.filters))

    @tool("list_sessions", render_sessions)
    async def list_sessions(_r):
        return await run(lambda engine: engine.list_sessions())

    @tool("delete_memories", render_delete)
    async def delete_memories(r: tools.DeleteManyRequest):
        return await run(lambda engine: engine.delete_memories(**r.model_dump(exclude={"filters"}), filters=r.filters))

    @tool("search")
    async def search(r: tools.SearchRequest):
        from ..web.search import asearch

        text, structured = split_answer(await asearch([i.model_dump(exclude_none=True) for i in r.items], r.max_tokens, config=config))
        return text_result(text, structured)

    @tool("scrape_urls")
    async def scrape(r: tools.ScrapeRequest):
        from ..web.scrape import ascrape_urls

        answer = await ascrape_urls([i.model_dump(exclude_none=True) for i in r.items], r.max_tokens, order=r.order,
                                    config=config, backend=r.backend,
                                    embedder=await engine_embedder(lambda: get_engine(config), config))
        return text_result(*split_answer(answer))

    @tool("current_datetime", render_datetime)
    async def now(_r):
        return current_datetime()

    if "browser_navigate" in offered:
        _browser_tools(server, config, tool)

    @server.resource("tinycontext://sessions", name="sessions", mime_type="application/json",
                     description="Memory sessions with their memory and token counts.")
    async def sessions_resource() -> str:
        return to_json(await run(lambda engine: engine.list_sessions()))

    @server.resource("tinycontext://stats", name="stats", mime_type="application/json",
                     description="Database statistics: memories, tokens, vectors, sessions, schema, embedder, search mode.")
    async def stats_resource() -> str:
        return to_json(await run(lambda engine: {**engine.stats(), "search_mode": engine.search_mode}))

    if config.management:
        manage.register_mcp(server, config, lambda: get_engine(config), server.caller)
        if manage.clear_offered(config):
            async def clear(_r) -> CallToolResult:
                caller = server.caller()
                result = await anyio.to_thread.run_sync(lambda: manage.clear_mine(config, caller))
                return text_result(f"Deleted {plural(result['deleted'], 'activity record')}.", result)

            server.offer(manage.CLEAR_TOOL, clear)

    server.output_schemas = output_schemas()
    return server


def _browser_tools(server: TinyContextMCP, config: TinyContextConfig, tool) -> None:
    """browser_navigate and browser_act. Each MCP client connection (one MCP session) gets its own browser
    session; the view is the text, the structured content only the facts around it (tab, url, tokens...)
    so the agent does not pay for the view twice."""
    from ..web.browser.service import get_service

    keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    def client() -> str:
        # One browser session per MCP session; it closes when the client's session object goes away.
        session = server.get_context().session
        key = keys.get(session)
        if key is None:
            key = keys[session] = f"mcp-{uuid.uuid4().hex}"
            weakref.finalize(session, get_service(config).close_later, key)
        return key

    async def answer(method: str, request: BaseModel) -> CallToolResult:
        result = await get_service(config).acall(method, client(), **request.model_dump())
        return text_result(result["view"], {k: v for k, v in result.items() if k != "view"})

    @tool("browser_navigate")
    async def navigate(r: tools.NavigateRequest):
        return await answer("navigate", r)

    @tool("browser_act")
    async def act(r: tools.ActRequest):
        return await answer("act", r)

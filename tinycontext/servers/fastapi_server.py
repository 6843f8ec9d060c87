"""REST app mirroring the MCP tools: ``uvicorn tinycontext.servers.fastapi_server:app``.

Importing this module opens nothing: the engine (database and model) is opened by the first request
that needs it, so a missing model answers 503 ``model_unavailable`` instead of failing the import.
Endpoints are plain ``def`` functions: FastAPI runs them in its threadpool, keeping the blocking
engine calls (ONNX, SQLite) off the event loop. Every error body is ``{code, message, details?}``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..version import __version__
from ..activity import open_activity
from ..config import TinyContextConfig, load_config
from ..memory.engine import MemoryEngine, get_engine
from ..errors import InvalidInputError, TinyContextError
from ..web.clock import current_datetime
from . import manage, otel, tools, ui
from .activity import RestRecorder, http_caller
from .guard import ServeSettings, protect
from .health import health_report
from .mcp_schemas import (
    BrowserView,
    DatetimeOutput,
    DeleteManyOutput,
    DeleteOutput,
    ListOutput,
    MemoryOutput,
    RecallOutput,
    SaveOutput,
    ScrapeOutput,
    SearchOutput,
    SessionsOutput,
)
from .web import engine_embedder, split_answer

log = logging.getLogger(__name__)

STATUS = {
    "invalid_input": 400, "empty_memory": 400, "recall_budget": 400,
    "session_not_found": 404, "memory_not_found": 404, "conflict": 409,
    # The server cannot work until its operator fixes the model, config or disk: not the client's fault.
    "model_unavailable": 503, "model_mismatch": 503, "config_error": 503, "storage_error": 503, "missing_extra": 503,
    "blocked": 403, "browser_busy": 503, "browser_error": 502, "unauthorized": 401, "forbidden": 403,
}
HTTP_CODES = {400: "invalid_input", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


class Health(BaseModel):
    status: str
    version: str
    memories: int
    sessions: int
    embedder: str | None


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


ERRORS = {status: {"model": ErrorBody} for status in (400, 401, 403, 404, 409, 413, 421, 422, 500, 503)}


class BrowserSession(tools.Strict):
    session_id: str = Field("default", min_length=1, max_length=200,
                            description="Your browser session (cookies, tabs); callers sharing a name share it.")


class NavigateBody(tools.NavigateRequest, BrowserSession):
    """browser_navigate's arguments, and which REST caller's browser session."""


class ActBody(tools.ActRequest, BrowserSession):
    """browser_act's arguments, and which REST caller's browser session."""


class _Engines:
    """Reads the config and opens the engine on first use; retries after a failure (e.g. once the model is fixed)."""

    def __init__(self, config: TinyContextConfig | None, engine: MemoryEngine | None):
        self._config, self.engine = config, engine
        self.lock = threading.Lock()

    def config(self) -> TinyContextConfig:
        with self.lock:
            if self._config is None:
                self._config = self.engine.config if self.engine is not None else load_config()
        return self._config

    def __call__(self) -> MemoryEngine:
        return self.engine if self.engine is not None else get_engine(self.config())


def _error(status: int, code: str, message: str, details: dict | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody(code=code, message=message, details=details).model_dump(exclude_none=True), status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    # loc and msg only: echoing the rejected input back could return megabytes or raw bytes.
    parts = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()[:10]]
    return "; ".join(parts) + ("" if len(exc.errors()) <= 10 else f"; and {len(exc.errors()) - 10} more")


def create_app(config: TinyContextConfig | None = None, *, engine: MemoryEngine | None = None,
               settings: ServeSettings | None = None) -> FastAPI:
    """The REST app. ``config`` defaults to ``load_config()`` at the first request; ``engine``
    (tests, embedding in another app) skips opening one. ``settings`` (token, CORS, body cap)
    default to the environment."""
    settings = settings or ServeSettings.from_env()
    engines = _Engines(config, engine)
    # Swagger UI and ReDoc from the fastapi-offline package's files: /docs works without a network.
    app = FastAPIOffline(title="TinyContext", version=__version__, responses=ERRORS, telemetry=otel.FASTAPI_TELEMETRY_OFF,
                         description="Token-light local memory for AI agents: the MCP tools over REST.")
    # Inside the guard: only requests it let through are recorded (when activity records are on). A file
    # that cannot be opened stops a configured app here, as it stops the MCP server.
    if config is not None:
        open_activity(config)
    app.add_middleware(RestRecorder, config=engines.config)
    protect(app, settings, open_paths=ui.OPEN_PATHS)
    ui.add_routes(app, engines)  # the memory browser at /ui

    @app.exception_handler(TinyContextError)
    async def engine_error(_request: Request, err: TinyContextError) -> JSONResponse:
        return _error(STATUS.get(err.code, 500), err.code, err.message, err.details or None)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid_input", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error(500, "internal_error", f"Unexpected {type(exc).__name__}; see the server log.")

    @app.get("/health", response_model=Health, summary="Liveness, and whether the engine can open")
    def health() -> dict:
        return health_report(engines())

    # Each body is its MCP tool's request model (tinycontext.servers.tools): one contract for both servers.
    @app.post("/save_memories", response_model=SaveOutput, summary="Save memories into a session")
    def save_memories(body: tools.SaveRequest) -> dict:
        return engines().save(body.memories, session_id=body.session_id, episode=body.episode)

    # Budgeted answers are sent as built: the body is exactly the JSON the budget counted (no re-serialization).
    @app.post("/recall_memories", response_model=RecallOutput, summary="Recall the most relevant memories within a token budget")
    def recall_memories(body: tools.RecallRequest) -> JSONResponse:
        page = engines().recall_rendered(body.query, session_id=body.session_id, max_tokens=body.max_tokens, top_k=body.top_k,
                                         tags=body.tags, offset=body.offset, detail=body.detail, filters=body.filters,
                                         include_superseded=body.include_superseded)
        return JSONResponse(page.structured)

    @app.post("/get_memory", response_model=MemoryOutput, summary="One memory with its edit history")
    def get_memory(body: tools.IdRequest) -> dict:
        return engines().get(body.id)

    @app.post("/update_memory", response_model=MemoryOutput, summary="Replace a memory's content, tags or metadata")
    def update_memory(body: tools.UpdateRequest) -> dict:
        return engines().update(body.id, body.content, tags=body.tags, metadata=body.metadata, expected_version=body.expected_version)

    @app.post("/delete_memory", response_model=DeleteOutput, summary="Delete a memory and its history")
    def delete_memory(body: tools.IdRequest) -> dict:
        return engines().delete(body.id)

    @app.post("/list_memories", response_model=ListOutput, summary="Browse memories (newest first by default) within a token budget")
    def list_memories(body: tools.ListRequest) -> JSONResponse:
        page = engines().list_memories(**body.model_dump(exclude={"filters"}), filters=body.filters)
        return JSONResponse(page.structured)

    @app.get("/sessions", response_model=SessionsOutput, summary="Sessions with their memory and token counts")
    def list_sessions() -> dict:
        return engines().list_sessions()

    @app.post("/delete_memories", response_model=DeleteManyOutput,
              summary="Delete by session, tags or filters: a dry run first, then confirm its count")
    def delete_memories(body: tools.DeleteManyRequest) -> dict:
        return engines().delete_memories(**body.model_dump(exclude={"filters"}), filters=body.filters)

    def web_config() -> TinyContextConfig:
        current = engines.config()
        if not current.web_tools:
            raise StarletteHTTPException(404, "The web tools are disabled (web_tools=false).")
        return current

    @app.post("/search", response_model=SearchOutput, tags=["web"], summary="Search the web: results and an outcome per query, within max_tokens")
    async def search(body: tools.SearchRequest) -> JSONResponse:
        from ..web.search import asearch

        answer = await asearch([i.model_dump(exclude_none=True) for i in body.items], body.max_tokens, config=web_config())
        return JSONResponse(split_answer(answer)[1])

    @app.post("/scrape_urls", response_model=ScrapeOutput, tags=["web"],
              summary="The passages of 1-5 pages that answer a query, within one token budget")
    async def scrape_urls(body: tools.ScrapeRequest) -> JSONResponse:
        from ..web.scrape import ascrape_urls

        current = web_config()
        answer = await ascrape_urls([i.model_dump(exclude_none=True) for i in body.items], body.max_tokens, order=body.order,
                                    config=current, backend=body.backend, embedder=await engine_embedder(engines, current))
        return JSONResponse(split_answer(answer)[1])

    @app.get("/current_datetime", response_model=DatetimeOutput, tags=["web"], summary="UTC and local time now")
    def datetime_now() -> dict:
        web_config()
        return current_datetime()

    if config is None or config.browser_backend != "off":
        def browser(method: str, body: BaseModel) -> dict:
            from ..web.browser.service import get_service

            current = engines.config()
            if current.browser_backend == "off":
                raise InvalidInputError("The browser tools are off (browser_backend=off).")
            arguments = body.model_dump(exclude={"session_id"})
            return get_service(current).call(method, "rest:" + body.session_id, **arguments)

        @app.post("/browser/navigate", response_model=BrowserView, response_model_exclude_none=True, tags=["browser"],
                  summary="Open a URL and read the page")
        def browser_navigate(body: NavigateBody) -> dict:
            return browser("navigate", body)

        @app.post("/browser/act", response_model=BrowserView, response_model_exclude_none=True, tags=["browser"],
                  summary="Act on the page by ref and read it again")
        def browser_act(body: ActBody) -> dict:
            return browser("act", body)

    if config is None or config.management:
        _manage_routes(app, engines)
    return app


def _manage_routes(app: FastAPI, engines: _Engines) -> None:
    """The management views under /manage/ (docs/management.md); 404 while management is off (the config
    is read at the first request when the app was built without one)."""

    def who(request: Request) -> tuple[TinyContextConfig, Any]:
        current = engines.config()
        if not current.management:
            raise StarletteHTTPException(404, "Management is off (TINYCONTEXT_MANAGEMENT=on turns it on).")
        return current, http_caller(current, "rest", request.client.host if request.client else None, request.headers)

    @app.get("/manage/manifest", tags=["manage"], summary="The management views and which this caller may read")
    def manage_manifest(request: Request) -> dict:
        return manage.manifest(*who(request))

    def reader(path: str):
        def read(request: Request) -> dict:
            current, caller = who(request)
            return manage.read_view(current, caller, path, engines)
        return read

    for view in manage.VIEWS:
        app.get(view.rest, tags=["manage"], summary=f"{view.title} ({view.scope} view)",
                name=f"manage_{view.path}")(reader(view.path))

    @app.post("/manage/my/clear", tags=["manage"], summary="Delete the activity records of your own calls")
    def manage_clear(request: Request) -> dict:
        return manage.clear_mine(*who(request))


def route_reference(api: FastAPI | None = None) -> str:
    """The route table of docs/rest.md (a test checks the page has exactly this), from the app's own OpenAPI:
    ``python -m tinycontext.servers.fastapi_server`` prints it."""
    api = api or create_app(TinyContextConfig(), settings=ServeSettings())
    lines = ["| method | path | what |", "|---|---|---|"]
    for path, operations in api.openapi()["paths"].items():
        lines += [f"| {method.upper()} | `{path}` | {op.get('summary', '')} |" for method, op in operations.items()]
    return "\n".join(lines)


otel.configure()  # `uvicorn tinycontext.servers.fastapi_server:app` is a standalone server too
app = create_app()

if __name__ == "__main__":
    print(route_reference())

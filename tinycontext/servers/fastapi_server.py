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
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..config import TinyContextConfig, load_config
from ..memory.engine import MemoryEngine, MemoryInput, get_engine
from .web_tools import router as web_router
from ..errors import TinyContextError
from ..retrieval.filters import FilterSpec
from ..budget.render import MIN_AGENT_TOKENS, Detail
from .browser_tools import router as browser_router
from . import browse_tools as browse
from .guard import ServeSettings, protect
from .mcp_schemas import DeleteOutput, MemoryOutput, RecallOutput, SaveOutput
from .health import health_report

log = logging.getLogger(__name__)

STATUS = {
    "invalid_input": 400, "empty_memory": 400, "recall_budget": 400,
    "session_not_found": 404, "memory_not_found": 404, "conflict": 409,
    # The server cannot work until its operator fixes the model, config or disk: not the client's fault.
    "model_unavailable": 503, "model_mismatch": 503, "config_error": 503, "storage_error": 503, "missing_extra": 503,
    "blocked": 403, "browser_busy": 503, "browser_error": 502,
}
HTTP_CODES = {400: "invalid_input", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


class _Request(BaseModel):
    # Strict: a number sent as a string, or a bool as a number, is a client bug worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True)


class SaveRequest(_Request):
    memories: list[MemoryInput] = Field(description="Memories to save: {content, tags?, metadata?, speaker?, occurred_at?, attachments?, episode?} each (batch limit: max_batch_size).")
    session_id: str | None = Field(None, description="Session to save into; 'default' when omitted.")
    episode: str | None = Field(None, description="Episode key for memories that name none; one call's turns form one by default.")


class RecallRequest(_Request):
    query: str = Field(description="What to remember: a question or keywords.")
    session_id: str | None = Field(None, description="Search only this session; omit to search all.")
    max_tokens: int | None = Field(None, description=f"Token budget for the whole response body ({MIN_AGENT_TOKENS}-1000000).")
    top_k: int | None = Field(None, description="At most this many memories (1-1000).")
    tags: list[str] | None = Field(None, description="Keep only memories with any of these tags.")
    offset: int = Field(0, description="Skip this many ranked results (paging).")
    filters: FilterSpec | None = Field(None, description="tags_any, tags_all, metadata equality, created_at/updated_at ranges.")
    detail: Detail = Field("compact", description="compact: id, rank, content, tags, date; full: every field and the scores.")


class IdRequest(_Request):
    id: int = Field(description="Memory id, as returned by save or recall.")


class UpdateRequest(IdRequest):
    content: str | None = Field(None, description="New text; unchanged when omitted.")
    tags: list[str] | None = Field(None, description="New tags (replace the old ones).")
    metadata: dict[str, Any] | None = Field(None, description="New metadata (replaces the old one).")
    expected_version: int | None = Field(None, description="Only update if still at this version; else 409 conflict.")


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


class _Engines:
    """Opens the engine on first use and retries after a failure (e.g. once the model is fixed)."""

    def __init__(self, config: TinyContextConfig | None, engine: MemoryEngine | None):
        self.config, self.engine = config, engine
        self.lock = threading.Lock()

    def __call__(self) -> MemoryEngine:
        if self.engine is not None:
            return self.engine
        with self.lock:
            if self.config is None:
                self.config = load_config()
        return get_engine(self.config)


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
    app = FastAPI(title="TinyContext", version=__version__, responses=ERRORS,
                  description="Token-light local memory for AI agents: the MCP tools over REST.")
    protect(app, settings)

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

    @app.post("/save_memories", response_model=SaveOutput, summary="Save memories into a session")
    def save_memories(body: SaveRequest) -> dict:
        return engines().save(body.memories, session_id=body.session_id, episode=body.episode)

    @app.post("/recall_memories", response_model=RecallOutput, summary="Recall the most relevant memories within a token budget")
    def recall_memories(body: RecallRequest) -> JSONResponse:
        # Sent as built: the body is exactly the JSON the budget counted (no model re-serialization).
        page = engines().recall_rendered(body.query, session_id=body.session_id, max_tokens=body.max_tokens, top_k=body.top_k,
                                         tags=body.tags, offset=body.offset, detail=body.detail, filters=body.filters)
        return JSONResponse(page.structured)

    @app.post("/update_memory", response_model=MemoryOutput, summary="Replace a memory's content, tags or metadata")
    def update_memory(body: UpdateRequest) -> dict:
        return engines().update(body.id, body.content, tags=body.tags, metadata=body.metadata, expected_version=body.expected_version)

    @app.post("/delete_memory", response_model=DeleteOutput, summary="Delete a memory and its history")
    def delete_memory(body: IdRequest) -> dict:
        return engines().delete(body.id)

    @app.post("/get_memory", response_model=MemoryOutput, summary="One memory with its edit history")
    def get_memory(body: IdRequest) -> dict:
        return engines().get(body.id)

    app.include_router(web_router(lambda: config or load_config(), engine=engines))
    app.include_router(browser_router(config))
    app.include_router(browse.router(engines))
    return app


app = create_app()

"""The memory browser at ``/ui`` of the REST app: a static page (``ui_static/``) over a small JSON API.

The page, its script and its style ship in the package and load nothing from anywhere else (the
Content-Security-Policy says so to the browser too). They hold no data, so the guard serves them
without the bearer token (:data:`OPEN_PATHS`); the page asks for the token and sends it on every API
call. The API under ``/ui/api`` is thin over the engine, like the REST endpoints, and is kept out of
the OpenAPI schema: it is the page's, not a client contract.

Writes are CSRF-safe: every API call, reads included, must carry the ``X-TinyContext-UI`` header (a
cross-origin page can only send it after a CORS preflight, which this app never grants to other
origins), an ``Origin`` when sent must be this server's own (the guard's rule for every route), and
a browser's ``Sec-Fetch-Site`` must say same-origin. GET never writes. A bearer token is no ambient
credential either: a foreign page cannot make the browser attach it.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Callable, Iterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field
from starlette.exceptions import HTTPException

from ..memory.engine import MemoryEngine
from ..memory.transfer import iter_export
from . import tools

UI_HEADER = "X-TinyContext-UI"
OPEN_PATHS = ("/ui", "/ui/static/")  # the page and its files; the guard reads a trailing "/" as a prefix
STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
# Only this server's own files: no CDN, no inline script, no framing (clickjacking), no form posts.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# A person browsing reads more than an agent's budget; the page still shows what an agent's answer costs.
BROWSE_MAX_TOKENS = 1_000_000


class SearchBody(tools.Strict):
    query: str
    session_id: str | None = None
    max_tokens: int | None = Field(None, description="The agent's budget whose answer (and cost) is shown.")
    top_k: int | None = None
    filters: tools.Filters | None = None
    detail: tools.Detail = "compact"
    include_superseded: bool = False


class ListBody(tools.ListRequest):
    speaker: str | None = None
    detail: tools.Detail = "full"
    max_tokens: int | None = BROWSE_MAX_TOKENS


class EditBody(tools.Strict):
    content: str | None = None
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    expected_version: int | None = None


class DeleteManyBody(tools.DeleteManyRequest):
    speaker: str | None = None


def same_origin(request: Request) -> None:
    """Refuse (403) an API call a page of another origin could have made; see the module's docstring."""
    if request.headers.get(UI_HEADER) != "1":
        raise HTTPException(403, f"The memory browser's API needs the {UI_HEADER}: 1 header.")
    if request.headers.get("sec-fetch-site", "same-origin") != "same-origin":
        raise HTTPException(403, "The memory browser only answers requests from its own page (Sec-Fetch-Site).")


def static_file(name: str) -> Response:
    if name not in STATIC:
        raise HTTPException(404, f"No file {name[:100]!r} in the memory browser.")
    body = resources.files(__package__).joinpath("ui_static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers=SECURITY_HEADERS)


def add_routes(app: FastAPI, engines: Callable[[], MemoryEngine]) -> None:
    """Mount the page and its API on the REST ``app``; ``engines()`` opens the engine on first use."""

    @app.get("/ui", include_in_schema=False)
    def page() -> Response:
        return static_file("index.html")

    @app.get("/ui/static/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        return static_file(name)

    api = APIRouter(prefix="/ui/api", include_in_schema=False, dependencies=[Depends(same_origin)])

    @api.get("/overview")
    def overview() -> dict:
        engine = engines()
        stats = engine.stats()
        return {"sessions": engine.list_sessions()["sessions"], "memories": stats["memories"], "tokens": stats["tokens"],
                "mode": engine.search_mode, "embedder": (stats["embedder"] or {}).get("model"),
                "schema_version": stats["schema_version"], "db_path": stats["db_path"]}

    @api.post("/search")
    def search(body: SearchBody) -> JSONResponse:
        """One real recall, rendered twice: the answer an agent gets (and its tokens), and the ranking
        it was cut from with every memory's BM25, dense and fused scores. Superseded facts are left
        out, as recall does, unless ``include_superseded`` (then they are marked)."""
        engine = engines()
        order = engine.rank(body.query, session_id=body.session_id, filters=body.filters, top_k=body.top_k,
                            include_superseded=body.include_superseded)
        answer = engine.render_recall(order, max_tokens=body.max_tokens, detail=body.detail)
        ranked = engine.render_recall(order, max_tokens=BROWSE_MAX_TOKENS, detail="full")
        chosen = {m["id"] for m in answer.structured["memories"]}
        return JSONResponse({
            "query": body.query, "mode": engine.search_mode,
            "answer": {"text": answer.text, "text_tokens": answer.text_tokens, "structured_tokens": answer.structured_tokens,
                       "max_tokens": answer.max_tokens, "detail": body.detail, "ids": sorted(chosen),
                       "truncated": answer.structured["truncated"]},
            "ranked": [{**m, "in_answer": m["id"] in chosen} for m in ranked.structured["memories"]],
            "below_floor": ranked.structured.get("below_floor", 0), "below_cliff": ranked.structured.get("below_cliff", 0),
            "superseded": ranked.structured.get("superseded", 0),
        })

    @api.post("/list")
    def list_memories(body: ListBody) -> JSONResponse:
        page = engines().list_memories(**body.model_dump(exclude={"filters"}), filters=body.filters)
        return JSONResponse(page.structured)

    @api.get("/memory/{memory_id}")
    def get_memory(memory_id: int) -> dict:
        return engines().get(memory_id)

    @api.post("/memory/{memory_id}")
    def edit_memory(memory_id: int, body: EditBody) -> dict:
        return engines().update(memory_id, body.content, tags=body.tags, metadata=body.metadata,
                                expected_version=body.expected_version)

    @api.delete("/memory/{memory_id}")
    def delete_memory(memory_id: int) -> dict:
        return engines().delete(memory_id)

    @api.post("/delete_memories")
    def delete_memories(body: DeleteManyBody) -> dict:
        return engines().delete_memories(**body.model_dump(exclude={"filters"}), filters=body.filters)

    @api.get("/export")
    def export(session_id: str | None = None, vectors: bool = False) -> StreamingResponse:
        records = iter_export(engines(), session_id=session_id, vectors=vectors)
        first = next(records)  # an unknown session fails here, as a 404, before the download starts

        def lines() -> Iterator[str]:
            # The same lines as `tinycontext export`, so `tinycontext import` reads the download.
            yield json.dumps(first, ensure_ascii=False) + "\n"
            for record in records:
                yield json.dumps(record, ensure_ascii=False) + "\n"

        name = "tinycontext-export" + (f"-{''.join(c for c in session_id if c.isalnum() or c in '-_')[:60]}" if session_id else "")
        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'})

    app.include_router(api)

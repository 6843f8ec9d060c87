"""The tools an agent sees: capability profiles, one strict request model per tool, compact schemas.

MCP and REST validate a tool's arguments with the same pydantic model (strict: no number sent as a
string, no boolean as an id; unknown arguments refused). What a model reads is written by hand for
it: a short description that says when to use the tool and an ``inputSchema`` with the arguments a
model sets. Advanced options (filters, conversation fields) are documented objects rather than
exhaustive nested schemas; the model still checks them fully on the server. Every request pays for
these definitions (MCP has no grouping), so the ``tools`` setting picks which capabilities a server
lists; :func:`schema_tokens` counts what a profile costs, the way a host sends it (name, description
and input schema as compact JSON). No MCP import here: doctor and the harness read it without the SDK.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..budget.render import DETAILS
from ..config import CAPABILITIES, TinyContextConfig
from ..memory.browse import ORDERS
from ..memory.engine import MemoryInput
from ..retrieval.filters import FilterSpec
from ..web.browser.service import ACTIONS

Order = Literal[tuple(ORDERS)]  # type: ignore[valid-type]
Detail = Literal[DETAILS]  # type: ignore[valid-type]
Action = Literal[ACTIONS]  # type: ignore[valid-type]


class Strict(BaseModel):
    # A number sent as a string, or a bool as a number, is a client bug worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True)


class MemoryItem(MemoryInput):
    model_config = ConfigDict(extra="forbid", strict=True)


class Filters(FilterSpec):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- one request model per tool -----------------------------------------------------------------

class SaveRequest(Strict):
    memories: list[MemoryItem] = Field(description="Memories to save: {content, tags?, metadata?, speaker?, occurred_at?, "
                                                   "attachments?, episode?, ttl_seconds?, expires_at?} each (batch limit: max_batch_size).")
    session_id: str | None = Field(None, description="Session to save into; 'default' when omitted.")
    episode: str | None = Field(None, description="Episode key for memories that name none; one call's turns form one by default.")


class RecallRequest(Strict):
    query: str = Field(description="What to remember: a question or keywords.")
    session_id: str | None = Field(None, description="Search only this session; omit to search all.")
    max_tokens: int | None = Field(None, description="Token budget for the whole answer (64-1000000).")
    top_k: int | None = Field(None, description="At most this many memories (1-1000).")
    tags: list[str] | None = Field(None, description="Keep only memories with any of these tags.")
    offset: int = Field(0, description="Skip this many ranked results (paging).")
    filters: Filters | None = Field(None, description="tags_any, tags_all, metadata equality, created_at/updated_at/occurred_at ranges.")
    detail: Detail = Field("compact", description="compact: id, rank, content, tags, date; full: every field and the scores.")
    include_superseded: bool = Field(False, description="Also return facts a newer memory superseded (marked superseded_by).")


class IdRequest(Strict):
    id: int = Field(description="Memory id, as returned by save or recall.")


class UpdateRequest(IdRequest):
    content: str | None = Field(None, description="New text; unchanged when omitted.")
    tags: list[str] | None = Field(None, description="New tags (replace the old ones).")
    metadata: dict[str, Any] | None = Field(None, description="New metadata (replaces the old one).")
    expected_version: int | None = Field(None, description="Only update if still at this version; else a conflict error.")


class ListRequest(Strict):
    session_id: str | None = Field(None, description="Only this session; omit for all.")
    tags: list[str] | None = Field(None, description="Only memories with any of these tags.")
    filters: Filters | None = Field(None, description="tags_any, tags_all, metadata equality, created_at/updated_at/occurred_at ranges.")
    order: Order = Field("newest", description="newest (last changed first), oldest (saved first) or id.")
    offset: int = Field(0, description="Skip this many (paging).")
    limit: int = Field(50, description="At most this many (1-1000).")
    max_tokens: int | None = Field(None, description="Token budget for the answer.")
    detail: Detail = Field("compact", description="compact or full.")


class NoArguments(Strict):
    pass


class DeleteManyRequest(Strict):
    session_id: str | None = Field(None, description="Delete this session's memories.")
    tags: list[str] | None = Field(None, description="Delete memories with any of these tags.")
    filters: Filters | None = Field(None, description="tags_any, tags_all, metadata equality, created_at/updated_at/occurred_at ranges.")
    dry_run: bool = Field(True, description="Only count the matches (default).")
    confirm: int | None = Field(None, description="The count the dry run reported; required to delete.")


class SearchItem(Strict):
    query: str = Field(description="What to search the web for.")
    domains: list[str] | None = Field(None, description="Only results from these domains (and their subdomains).")


class ScrapeItem(Strict):
    url: str = Field(description="http(s) URL of the page.")
    query: str | None = Field(None, description="What to look for on the page; omit or '*' for the page itself in order.")


class SearchRequest(Strict):
    items: list[SearchItem] = Field(description="1-5 searches: {query, domains?} each.")
    max_tokens: int | None = Field(None, description="Token budget for the whole answer.")


class ScrapeRequest(Strict):
    items: list[ScrapeItem] = Field(description="1-5 pages: {url, query?} each.")
    max_tokens: int | None = Field(None, description="Token budget shared by all pages.")
    order: Literal["page", "rank"] = Field("page", description="Passages of a page in page order or best first (rank).")
    backend: Literal["http", "browser", "auto"] | None = Field(None, description="http, browser or auto (default: scrape_backend).")


class NavigateRequest(Strict):
    url: str = Field(description="http(s) URL to open.")
    find: str | None = Field(None, description="Keep only elements matching this regex (or text) with their context.")
    depth: int | None = Field(None, ge=1, description="Levels of the tree to show.")
    max_tokens: int | None = Field(None, ge=64, le=1_000_000, description="Token budget of the view.")


class ActRequest(Strict):
    action: Action = Field(description="What to do.")
    ref: str | None = Field(None, description="ref=eN from the latest view.")
    text: str | None = Field(None, description="Text to type, key to press, text to wait for, or tab number.")
    find: str | None = Field(None, description="Keep only elements matching this regex (or text) with their context.")
    depth: int | None = Field(None, ge=1, description="Levels of the tree to show.")
    max_tokens: int | None = Field(None, ge=64, le=1_000_000, description="Token budget of the view.")


# -- what a model reads ---------------------------------------------------------------------------

def _t(kind: str, description: str | None = None, **more) -> dict:
    return {"type": kind, **({"description": description} if description else {}), **more}


STRINGS = {"type": "array", "items": {"type": "string"}}
FILTERS = _t("object", "tags_any, tags_all, metadata {k: v}, created_at/updated_at/occurred_at {gte, gt, lte, lt}")
SESSION = _t("string", "Session (namespace), e.g. a project")


@dataclass(frozen=True)
class ToolSpec:
    """A tool as both servers offer it: ``request`` validates, the rest is what a model reads."""

    name: str
    capability: str
    title: str
    description: str
    properties: dict[str, dict]
    request: type[BaseModel]
    required: tuple[str, ...] = ()
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False

    @property
    def input_schema(self) -> dict:
        schema: dict[str, Any] = {"type": "object", "properties": self.properties}
        if self.required:
            schema["required"] = list(self.required)
        return schema

    def visible(self) -> dict:
        """What a host puts in the model's context for this tool."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


def specs(config: TinyContextConfig) -> list[ToolSpec]:
    """Every tool the servers know, in listing order; descriptions quote ``config``'s defaults."""
    return [
        ToolSpec(
            "save_memories", "memory", "Save memories",
            "Save durable facts to long-term memory: preferences, decisions and why, conventions, corrections. One "
            "self-contained fact per memory, several per call; no chit-chat, temporary state or secrets. Exact repeats "
            "are skipped, near-duplicates reported. A conversation: one call per chat session, one turn per memory "
            "with speaker and occurred_at.",
            {"memories": {"type": "array", "items": _t(
                "object", "Also: metadata {}, speaker, occurred_at (ISO 8601), attachments [text, e.g. image caption], "
                          "episode, ttl_seconds, expires_at, supersedes (id it replaces), valid_from",
                properties={"content": {"type": "string"}, "tags": STRINGS}, required=["content"])},
             "session_id": SESSION, "episode": _t("string", "Episode of memories that name none")},
            SaveRequest, ("memories",)),
        ToolSpec(
            "recall_memories", "memory", "Recall memories",
            "Search long-term memory. Call it before answering anything that may depend on earlier conversations or "
            "the user's preferences, projects or decisions. Returns the best matches, one line each (content, date, "
            f"tags, id), within max_tokens (default {config.recall_max_tokens}); an offset hint at the end pages on.",
            {"query": _t("string", "Question or keywords"), "max_tokens": {"type": "integer"},
             "top_k": _t("integer", f"default {config.recall_top_k}"), "session_id": _t("string", "Only this session"),
             "tags": {**STRINGS, "description": "Any of these tags"}, "filters": FILTERS, "offset": {"type": "integer"},
             "detail": {"enum": list(DETAILS), "description": "full: also metadata, session, versions, scores"},
             "include_superseded": {"type": "boolean"}},
            RecallRequest, ("query",), read_only=True),
        ToolSpec(
            "get_memory", "manage", "Get a memory",
            "One memory by id with its metadata and edit history.",
            {"id": {"type": "integer"}}, IdRequest, ("id",), read_only=True),
        ToolSpec(
            "update_memory", "manage", "Update a memory",
            "Correct a memory whose fact changed, instead of saving a contradicting one. Only the fields given change "
            "(tags and metadata as a whole); the old version stays in its history.",
            {"id": {"type": "integer"}, "content": {"type": "string"}, "tags": STRINGS, "metadata": {"type": "object"},
             "expected_version": _t("integer", "Refuse if the memory changed since (conflict)")},
            UpdateRequest, ("id",), idempotent=True),
        ToolSpec(
            "delete_memory", "manage", "Delete a memory",
            "Delete a memory that is wrong or that the user asked to forget, history included.",
            {"id": {"type": "integer"}}, IdRequest, ("id",), destructive=True, idempotent=True),
        ToolSpec(
            "list_memories", "manage", "List memories",
            "Browse memories without a query, newest first: one line each within max_tokens. Follow the offset hint "
            "for more.",
            {"session_id": {"type": "string"}, "tags": {**STRINGS, "description": "Any of these tags"}, "filters": FILTERS,
             "order": {"enum": list(ORDERS)}, "offset": {"type": "integer"}, "limit": _t("integer", "default 50"),
             "max_tokens": {"type": "integer"}, "detail": {"enum": list(DETAILS)}},
            ListRequest, read_only=True),
        ToolSpec(
            "list_sessions", "manage", "List sessions",
            "The sessions with their memory and token counts.", {}, NoArguments, read_only=True),
        ToolSpec(
            "delete_memories", "manage", "Delete memories in bulk",
            "Delete every memory of a session, tags or filters (e.g. the user asks to forget a project). First a dry "
            "run (default) counts the matches; tell the user, then call with dry_run false and confirm=that count.",
            {"session_id": {"type": "string"}, "tags": {**STRINGS, "description": "Any of these tags"}, "filters": FILTERS,
             "dry_run": {"type": "boolean"}, "confirm": {"type": "integer"}},
            DeleteManyRequest, destructive=True),
        ToolSpec(
            "search", "web", "Search the web",
            "Search the web: results (title, url, snippet, date) per query, in the backend's order, within max_tokens. "
            "Read promising pages with scrape_urls.",
            {"items": {"type": "array", "description": "1-5", "items": _t(
                "object", properties={"query": {"type": "string"}, "domains": {**STRINGS, "description": "Only these sites"}},
                required=["query"])}, "max_tokens": {"type": "integer"}},
            SearchRequest, ("items",), read_only=True, open_world=True),
        ToolSpec(
            "scrape_urls", "web", "Scrape web pages",
            "Read web pages (HTML, text, PDF): with a query, only the passages that answer it and the best links; "
            f"without, the main content in order. All pages share max_tokens (default {config.scrape_max_tokens}). "
            "Private addresses are refused.",
            {"items": {"type": "array", "description": "1-5", "items": _t(
                "object", properties={"url": {"type": "string"}, "query": {"type": "string"}}, required=["url"])},
             "max_tokens": {"type": "integer"}, "order": {"enum": ["page", "rank"]},
             "backend": {"enum": ["http", "browser", "auto"], "description": "browser runs scripts; auto: when http finds no content"}},
            ScrapeRequest, ("items",), read_only=True, open_world=True),
        ToolSpec(
            "current_datetime", "web", "Current date and time",
            "The current date and time (UTC and local).", {}, NoArguments, read_only=True),
        ToolSpec(
            "browser_navigate", "browser", "Open a page in a browser",
            "Open a URL in a real browser (scripts run) and read the page as an accessibility tree, one element per "
            "line; those you can act on end with ref=eN (see browser_act). For pages a plain fetch cannot read. "
            "find (regex) keeps matching elements, depth the top levels.",
            {"url": {"type": "string"}, "find": {"type": "string"}, "depth": {"type": "integer"},
             "max_tokens": {"type": "integer"}},
            NavigateRequest, ("url",), open_world=True),
        ToolSpec(
            "browser_act", "browser", "Act in the browser page",
            "Act in the page browser_navigate opened, then read it again. look; click ref; type ref text (replaces "
            "the field); press text (a key: Enter, PageDown...; ref focuses first); wait_for text (or quiet network); "
            "tabs; switch_tab text=N; close (tab N, or the current).",
            {"action": {"enum": list(ACTIONS)}, "ref": {"type": "string"}, "text": {"type": "string"},
             "find": {"type": "string"}, "depth": {"type": "integer"}, "max_tokens": {"type": "integer"}},
            ActRequest, ("action",), open_world=True),
    ]


def enabled(config: TinyContextConfig) -> set[str]:
    """The capabilities ``config`` turns on: those named in ``tools``, less web without ``web_tools`` and
    browser with ``browser_backend`` off (both also switch off the CLI and REST side)."""
    return {c for c in config.tools if not (c == "web" and not config.web_tools)
            and not (c == "browser" and config.browser_backend == "off")}


def active(config: TinyContextConfig) -> list[ToolSpec]:
    """The tools a server for ``config`` lists."""
    on = enabled(config)
    return [spec for spec in specs(config) if spec.capability in on]


def schema_tokens(tools: list[ToolSpec], encoding: str = "o200k_base") -> dict[str, int]:
    """Tokens a host sends the model for each tool on every request (compact JSON, as the issue's meter counts)."""
    from ..budget.tokens import get_encoding

    enc = get_encoding(encoding)
    return {t.name: len(enc.encode_ordinary(json.dumps(t.visible(), separators=(",", ":"), ensure_ascii=False)))
            for t in tools}


def reference(config: TinyContextConfig | None = None) -> str:
    """The tool table of docs/mcp.md (a test checks that the page has exactly this):
    ``python -m tinycontext.servers.tools`` prints it."""
    config = config or TinyContextConfig(tools=CAPABILITIES)
    every = specs(config)
    tokens = schema_tokens(every, config.encoding_name)
    default = TinyContextConfig.model_fields["tools"].default
    lines = ["| capability | tool | title | tokens |", "|---|---|---|---|"]
    for spec in every:
        lines.append(f"| `{spec.capability}`{' (default)' if spec.capability in default else ''} | `{spec.name}` | {spec.title} | "
                     f"{tokens[spec.name]} |")
    for capability in CAPABILITIES:
        lines.append(f"| `{capability}` | all {sum(1 for s in every if s.capability == capability)} | | "
                     f"{sum(tokens[s.name] for s in every if s.capability == capability)} |")
    lines.append(f"| every capability (`tools=all`) | all {len(every)} | | {sum(tokens.values())} |")
    return "\n".join(lines)


__all__ = ["CAPABILITIES", "ToolSpec", "specs", "active", "enabled", "schema_tokens", "reference"]

if __name__ == "__main__":
    print(reference())

"""Output schemas of the MCP tools: what each tool's structured content looks like.

Clients read them from ``tools/list`` (``outputSchema``) and the official SDKs check every result's
structured content against them. The REST app answers with the same models. The shapes follow what
the tools hand over: compact recall and listing items from :mod:`tinycontext.render`, the engine's
save/get/update/delete answers, the browse answers, the browser's view facts. Objects allow extra
keys, so a field added later (e.g. by ``detail="full"``) stays valid. Error results (``isError``)
carry no structured content: the TypeScript SDK would check it against these success shapes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class MemoryItem(_Open):
    """A memory in a recall or listing: compact (id, rank, content, tags, date) or every field (detail=full)."""

    id: int
    content: str
    rank: int | None = None
    tags: list[str] | None = None
    date: str | None = Field(None, description="YYYY-MM-DD of the last change (compact detail).")
    superseded_by: int | None = Field(None, description="Set on an outdated fact (include_superseded): the id that replaced it.")


class RecallOutput(_Open):
    memories: list[MemoryItem]
    total_tokens: int = Field(description="Tokens of the text answer.")
    max_tokens: int
    truncated: bool
    next_offset: int | None = Field(description="Pass as offset for the next page; null when there is none.")
    omitted: int | None = Field(None, description="Matches that did not fit max_tokens.")
    needed_tokens: int | None = Field(None, description="When nothing fit: the max_tokens that shows the best match.")
    mode: str | None = Field(None, description='"keyword" when no embedding model is available (BM25 only).')
    below_floor: int | None = Field(None, description="Candidates left out by the relevance floor (no lexical match, weak similarity).")
    below_cliff: int | None = Field(None, description="Candidates left out after the score cliff (clearly weaker than those returned).")


class Saved(BaseModel):
    index: int
    id: int
    tokens: int
    supersedes: int | None = Field(None, description="The memory this one replaced.")


class SaveOutput(_Open):
    session_id: str
    ids: list[int]
    saved: list[Saved]
    skipped: list[dict[str, Any]] = Field(description="{index, reason: duplicate|near_duplicate, duplicate_of|similar_to}")
    near_duplicates: list[dict[str, Any]] = Field(description="{index, similar_to, similarity} of saved near-duplicates")
    supersession_candidates: list[dict[str, Any]] | None = Field(
        None, description="{index, supersedes, similarity, was, now}: stored facts these may replace (not applied)")
    total_tokens: int


class MemoryOutput(_Open):
    id: int
    session_id: str
    content: str
    tags: list[str]
    metadata: dict[str, Any]
    tokens: int
    created_at: str
    updated_at: str
    version: int
    occurred_at: str | None = Field(None, description="When it happened (conversation turns).")
    speaker: str | None = None
    attachments: list[str] = Field(default_factory=list, description="What was shared with it, e.g. an image caption.")
    episode: str | None = Field(None, description="Episode key (chat session, thread).")
    history: list[dict[str, Any]] | None = Field(None, description="Earlier versions, oldest first.")


class DeleteOutput(_Open):
    id: int
    deleted: bool


class ListOutput(_Open):
    memories: list[MemoryItem]
    total: int = Field(description="Memories matching, over all pages.")
    offset: int
    next_offset: int | None
    truncated: bool
    total_tokens: int
    max_tokens: int
    needed_tokens: int | None = None


class SessionInfo(_Open):
    session_id: str
    created_at: str
    memories: int
    tokens: int


class SessionsOutput(_Open):
    sessions: list[SessionInfo]
    total: int


class DeleteManyOutput(_Open):
    matched: int
    deleted: int
    dry_run: bool
    next: str | None = Field(None, description="What to call to delete for real (dry runs).")


class SearchResult(_Open):
    query: str
    outcome: str = Field(description="ok, no_results, blocked, unavailable or invalid.")
    results: list[dict[str, Any]] = Field(description="{title, url, snippet, date?} in the backend's order.")


class SearchOutput(_Open):
    searches: list[SearchResult]
    total_tokens: int
    max_tokens: int
    truncated: bool


class ScrapedPage(_Open):
    url: str
    outcome: str = Field(description="ok, blocked, http_error, timeout, too_large, unsupported_type, empty, unavailable, invalid.")
    title: str | None = None
    passages: list[dict[str, Any]] | None = Field(None, description="{text, start} original text of the page.")
    links: list[dict[str, Any]] | None = None


class ScrapeOutput(_Open):
    results: list[ScrapedPage]
    total_tokens: int
    max_tokens: int
    truncated: bool


class BrowserView(BaseModel):
    """A browser tool's answer over REST; MCP sends ``view`` as the text and the rest as structured content."""

    view: str = Field(description="The page as the agent reads it: header, notes, one line per element.")
    tab: int | None
    tabs: int
    url: str | None = None
    title: str | None = None
    tokens: int = Field(description="Tokens of view.")
    structured_tokens: int = Field(description="Tokens of the other fields as compact JSON (MCP structured content).")
    truncated: bool
    refs: list[str] = Field(description="Refs shown in the view (the ones click and type accept).")
    matches: int | None = None
    closed: bool | None = None


class DatetimeOutput(_Open):
    utc: str
    local: str
    timezone: str
    utc_offset: str
    weekday: str


OUTPUTS: dict[str, type[BaseModel]] = {
    "save_memories": SaveOutput, "recall_memories": RecallOutput, "update_memory": MemoryOutput,
    "get_memory": MemoryOutput, "delete_memory": DeleteOutput, "list_memories": ListOutput,
    "list_sessions": SessionsOutput, "delete_memories": DeleteManyOutput,
    "search": SearchOutput, "scrape_urls": ScrapeOutput, "current_datetime": DatetimeOutput,
}


def output_schemas() -> dict[str, dict]:
    """Tool name -> JSON schema of its structured content."""
    schemas = {name: model.model_json_schema() for name, model in OUTPUTS.items()}
    # The browser tools hand over their view model's facts; the view itself is the text content.
    browser = BrowserView.model_json_schema()
    browser["properties"].pop("view", None)
    browser["required"] = [r for r in browser.get("required", []) if r != "view"]
    schemas["browser_navigate"] = schemas["browser_act"] = browser
    return schemas

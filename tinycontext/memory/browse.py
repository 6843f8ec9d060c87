"""Living with a memory store: listing, sessions, bulk deletion and expiry.

``list_memories`` pages through memories (newest first by default) as compact lines fitted to a
token budget by :func:`tinycontext.budget.render.fit_page`, so browsing a big store never floods an agent's
context. ``delete_memories`` removes everything matching a session, tags or a filter, but only after
a dry run: the real deletion must name the count the dry run reported, so a filter that matches more
than the caller saw deletes nothing. Memories saved with ``expires_at`` / ``ttl_seconds`` are
deleted by :func:`purge_expired`, which recall and listing call first, so an expired memory is never
returned and does not linger.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..retrieval import conversation
from ..errors import InvalidInputError, SessionNotFoundError
from ..retrieval.filters import parse_filters
from ..budget.render import Detail, Page, check_agent_budget, check_detail, fit_page, memory_item, memory_line, plural
from .store import MEMORY_COLUMNS, now_iso, row_to_memory

ORDERS = {
    "newest": "coalesce(updated_at, created_at) DESC, id DESC",
    "oldest": "created_at ASC, id ASC",
    "id": "id ASC",
}
MAX_LIST_LIMIT = 1000
MAX_OFFSET = 1_000_000


def _where(engine, session_id: str | None, tags: Sequence[str] | None, filters,
           speaker: str | None = None) -> tuple[str, list, str | None]:
    """SQL condition on ``memories`` (column ``id``), its params, and the checked session."""
    session = session_id
    if session is not None:
        if not isinstance(session, str) or not session.strip():
            raise InvalidInputError("session_id must be a non-empty string.")
        if not engine.store.has_session(session):
            raise SessionNotFoundError(f"No session {session[:200]!r}; list_sessions shows the existing ones.")
    # ``tags`` is the any-of shorthand, validated like the filter's own tags_any.
    shorthand = parse_filters(None if tags is None else {"tags_any": tags})
    sql, params = "1", []
    if session is not None:
        sql += " AND session_id = ?"
        params.append(session)
    # The save path's label check: a name is compared as it was stored (whitespace collapsed).
    speaker = conversation.check_label(speaker, "speaker", conversation.MAX_SPEAKER_CHARS, "filter")
    if speaker is not None:
        sql += " AND speaker = ?"
        params.append(speaker)
    for part in (shorthand, parse_filters(filters)):
        condition, values = part.sql("id")
        if condition:
            sql += " AND " + condition
            params += values
    return sql, params, session


def purge_expired(engine) -> int:
    """Delete memories whose ``expires_at`` has passed; returns how many. Cheap when none has (index)."""
    now = now_iso()
    if not engine.store.read("SELECT 1 FROM memories WHERE expires_at <= ? LIMIT 1", (now,)):
        return 0
    return _delete_where(engine, "expires_at <= ?", [now])


def _delete_where(engine, condition: str, params: list, expected: int | None = None) -> int:
    with engine.index.write() as conn:
        rows = conn.execute(f"SELECT id, session_id, episode_id FROM memories WHERE {condition}", params).fetchall()
        if expected is not None and len(rows) != expected:
            raise InvalidInputError(f"The filter now matches {len(rows)} memories, not the {expected} you confirmed; "
                                    "nothing was deleted. Run the dry run again and confirm the new count.")
        ids = [r[0] for r in rows]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            conn.execute(f"DELETE FROM memory_vectors WHERE memory_id IN ({marks})", chunk)
            conn.execute(f"DELETE FROM memory_tags WHERE memory_id IN ({marks})", chunk)
            conn.execute(f"DELETE FROM memory_versions WHERE memory_id IN ({marks})", chunk)
            conn.execute(f"DELETE FROM memories WHERE id IN ({marks})", chunk)
        for memory_id, session, _ in rows:
            engine.index.remove(session, memory_id)
        conversation.index_episodes(conn, [r[2] for r in rows if r[2] is not None])
    return len(rows)


def list_memories(engine, *, session_id: str | None = None, tags: Sequence[str] | None = None,
                  filters=None, order: str = "newest", offset: int = 0, limit: int = 50, max_tokens: int | None = None,
                  detail: Detail = "compact", speaker: str | None = None) -> Page:
    """A page of memories in ``order`` (newest, oldest, id) as lines and structured content that
    both fit ``max_tokens``; ``next_offset`` in the structured content continues the listing.
    ``speaker``: only what that speaker said (conversation turns)."""
    if order not in ORDERS:
        raise InvalidInputError(f"order must be one of {', '.join(ORDERS)}, got {str(order)[:20]!r}.")
    for name, value, low, high in (("offset", offset, 0, MAX_OFFSET), ("limit", limit, 1, MAX_LIST_LIMIT)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidInputError(f"{name} must be an integer from {low} to {high}, got {value!r}.")
    detail = check_detail(detail)
    max_tokens = check_agent_budget(engine.config.recall_max_tokens if max_tokens is None else max_tokens)
    purge_expired(engine)
    where, params, session = _where(engine, session_id, tags, filters, speaker)
    total = engine.store.read(f"SELECT count(*) FROM memories WHERE {where}", params)[0][0]
    # One row beyond the limit tells fit_page there is more after this page.
    rows = engine.store.read(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where} ORDER BY {ORDERS[order]} LIMIT ? OFFSET ?",
                             [*params, limit + 1, offset])
    memories = [row_to_memory(r) for r in rows]
    with_session = session is None and len({m["session_id"] for m in memories}) > 1

    def next_offset(page: Page) -> int | None:
        return None if page.next_position is None else offset + page.next_position

    def text(lines: list[str], page: Page) -> str:
        if page.needed is not None:
            return f"Nothing fits max_tokens={page.max_tokens}: the first memory needs max_tokens={page.needed}."
        if not lines and not page.skipped:
            return "No memories." if not offset else f"No memories after offset {offset} (total {total})."
        out = [f"{plural(total, 'memory', 'memories')}; showing {len(lines)} from offset {offset} ({order} first):", *lines]
        if page.skipped:
            out.append(f"({len(page.skipped)} did not fit max_tokens={page.max_tokens}.)")
        if page.next_position is not None:
            out.append(f"(More: call again with offset={next_offset(page)}.)")
        return "\n".join(out)

    def structured(items: list[dict], page: Page) -> dict[str, Any]:
        out: dict[str, Any] = {"memories": items, "total": total, "offset": offset, "next_offset": next_offset(page),
                               "truncated": page.truncated, "total_tokens": page.text_tokens, "max_tokens": page.max_tokens}
        if page.needed is not None:
            out["needed_tokens"] = page.needed
        return out

    return fit_page(memories, max_tokens=max_tokens, counter=engine.tokens, limit=limit,
                    line=lambda m: memory_line(m, detail=detail, with_session=with_session),
                    item=lambda m: memory_item(m, detail=detail), text_frame=text, structured_frame=structured)


def list_sessions(engine) -> dict:
    """Every session with its memory count and tokens, oldest first."""
    purge_expired(engine)
    sessions = engine.sessions()
    return {"sessions": sessions, "total": len(sessions)}


def delete_memories(engine, *, session_id: str | None = None, tags: Sequence[str] | None = None,
                    filters=None, dry_run: bool = True, confirm: int | None = None, speaker: str | None = None) -> dict:
    """Delete every memory matching the session, tags (any of) and filters.

    With ``dry_run`` (the default) nothing changes: the answer says how many match. Deleting needs
    ``dry_run=False`` and ``confirm`` equal to that count; if the match changed meanwhile nothing
    is deleted. At least one of session, tags, filters or speaker is required.
    """
    if not isinstance(dry_run, bool):
        raise InvalidInputError("dry_run must be true or false.")
    where, params, session = _where(engine, session_id, tags, filters, speaker)
    if where == "1":
        raise InvalidInputError("Give a session_id, tags, filters or speaker to delete by; deleting everything is not offered.")
    matched = engine.store.read(f"SELECT count(*) FROM memories WHERE {where}", params)[0][0]
    if dry_run:
        return {"matched": matched, "deleted": 0, "dry_run": True,
                "next": f"To delete them call again with dry_run=false and confirm={matched}."}
    if isinstance(confirm, bool) or not isinstance(confirm, int):
        raise InvalidInputError(f"Deleting needs confirm=<count from the dry run> (it matches {matched} now); nothing was deleted.")
    deleted = _delete_where(engine, where, params, expected=confirm)
    return {"matched": deleted, "deleted": deleted, "dry_run": False}

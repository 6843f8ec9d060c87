"""What a caller may save: the :class:`MemoryInput` and :class:`StoredMemory` models and their checks.

:func:`validate_memories` is the one check every write goes through (save, update, import): content,
tags, metadata size and depth, conversation fields and expiry, with a typed error naming the bad
memory. :func:`check_stored` adds what an import carries (uid, id, dates, history, vector).
"""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import TinyContextConfig
from ..errors import EmptyMemoryError, InvalidInputError
from ..retrieval import conversation
from ..retrieval.filters import expiry, parse_occurred_at, parse_time
from .checks import BLANK, check_int, clean_text, normalise_tags

MAX_METADATA_BYTES = 64_000
MAX_METADATA_DEPTH = 16


class MemoryInput(BaseModel):
    """One memory to save. ``content`` is what recall returns and what the budget counts.

    Conversation turns may also say when they happened (``occurred_at``, ISO 8601), who said them
    (``speaker``), what was shared with them (``attachments``: text such as an image caption) and
    which ``episode`` (chat session, thread) they belong to; see tinycontext/retrieval/conversation.py.
    """

    model_config = ConfigDict(extra="forbid")

    content: str
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    occurred_at: str | datetime | date | None = Field(None, description="When it happened (ISO 8601: 2023-05-08 or 2023-05-08T13:56).")
    speaker: str | None = Field(None, description="Who said it (a conversation turn).")
    attachments: list[str] = Field(default_factory=list, description="Text descriptions of what was shared with it, e.g. an image caption.")
    episode: str | None = Field(None, description="Episode key (chat session, thread); one save call's turns form one by default.")
    expires_at: str | None = Field(None, description="ISO 8601 time after which the memory is deleted (optional).")
    ttl_seconds: int | None = Field(None, description="Delete the memory this many seconds after saving (optional).")
    supersedes: int | None = Field(None, description="Id of the memory this one replaces: it gets valid_until, recall prefers this one.")
    valid_from: str | None = Field(None, description="ISO 8601 time since when the fact holds (default: when saved).")


class StoredMemory(MemoryInput):
    """A memory as exported, for :meth:`MemoryEngine.import_memories`: what saving would store, plus
    what an export keeps. ``uid`` is the memory's stable identity (present: skipped on import)."""

    uid: str | None = Field(None, min_length=1, max_length=200)
    id: int | None = None
    created_at: str | None = None
    updated_at: str | None = None
    version: int = Field(1, ge=1)
    history: list[dict[str, Any]] = Field(default_factory=list)
    # The stored vector (float32 little-endian bytes, or numbers), reused when it fits this embedder.
    vector: list[float] | bytes | None = None
    valid_until: str | None = None
    superseded_by: int | None = None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_METADATA_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()], default=level + 1)
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value], default=level + 1)
    return level


def validate_memories(memories: Iterable[MemoryInput | dict | str], config: TinyContextConfig) -> list[MemoryInput]:
    """The memories to save, checked and cleaned; the first bad one raises, naming its index."""
    if isinstance(memories, (str, dict, MemoryInput)):
        memories = [memories]
    try:
        items = list(memories)
    except TypeError as exc:
        raise InvalidInputError("memories must be a list of {content, tags?, metadata?} objects.") from exc
    if not items:
        raise EmptyMemoryError("Nothing to save: pass at least one memory with non-empty content.")
    if len(items) > config.max_batch_size:
        raise InvalidInputError(f"At most {config.max_batch_size} memories per call ({len(items)} given); split the batch.")
    out: list[MemoryInput] = []
    for i, item in enumerate(items):
        where = f"memories[{i}]"
        try:
            if isinstance(item, str):
                item = MemoryInput(content=item)
            elif isinstance(item, dict):
                item = MemoryInput(**item)
            elif not isinstance(item, MemoryInput):
                raise InvalidInputError(f"{where} must be an object with 'content', not {type(item).__name__}.")
        except (ValidationError, TypeError) as exc:
            raise InvalidInputError(f"{where} is malformed: {exc}".splitlines()[0] + " Expected {content: str, tags: [str], metadata: {}}.") from exc
        content = clean_text(item.content, f"{where}.content").strip()
        if BLANK.fullmatch(content):
            raise EmptyMemoryError(f"{where} has empty content; give every memory some text.", index=i)
        if len(content) > config.max_content_chars:
            raise InvalidInputError(f"{where}.content has {len(content)} characters; the limit is {config.max_content_chars}. Split it or save a summary.", index=i)
        # Depth first: json.dumps of very deep nesting raises RecursionError.
        too_deep = _depth(item.metadata) > MAX_METADATA_DEPTH
        try:
            meta_json = "" if too_deep else json.dumps(item.metadata, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{where}.metadata must be plain JSON: {exc}", index=i) from exc
        clean_text(meta_json, f"{where}.metadata")
        if too_deep or len(meta_json.encode("utf-8")) > MAX_METADATA_BYTES:
            raise InvalidInputError(f"{where}.metadata is too large (max {MAX_METADATA_BYTES} bytes, depth {MAX_METADATA_DEPTH}).", index=i)
        out.append(MemoryInput(
            content=content, tags=normalise_tags(item.tags, where), metadata=item.metadata,
            occurred_at=parse_occurred_at(item.occurred_at, where),
            speaker=conversation.check_label(item.speaker, "speaker", conversation.MAX_SPEAKER_CHARS, where),
            attachments=conversation.check_attachments(item.attachments, where),
            episode=conversation.check_label(item.episode, "episode", conversation.MAX_EPISODE_CHARS, where),
            expires_at=expiry(item.expires_at, item.ttl_seconds, where),
            supersedes=None if item.supersedes is None else check_int(item.supersedes, f"{where}.supersedes", 1, 2**63 - 1),
            valid_from=None if item.valid_from is None else parse_time(item.valid_from, f"{where}.valid_from"),
        ))
    return out


def check_stored(memories: Sequence[StoredMemory | dict], config: TinyContextConfig) -> tuple[list[MemoryInput], list[StoredMemory]]:
    """Exported memories checked for :meth:`MemoryEngine.import_memories`, as saved memories and as
    what the export carries."""
    try:
        stored = [m if isinstance(m, StoredMemory) else StoredMemory.model_validate(m) for m in memories]
    except ValidationError as exc:
        raise InvalidInputError(f"memories are malformed: {exc}".splitlines()[0]) from exc
    items = validate_memories(stored, config)  # a StoredMemory is a MemoryInput: checked as saved memories are
    for i, m in enumerate(stored):
        # What is stored as given: SQLite text without NULs or lone surrogates, integers SQLite holds.
        for name in ("uid", "created_at", "updated_at", "valid_until"):
            if getattr(m, name) is not None:
                clean_text(getattr(m, name), f"memories[{i}].{name}")
        for name in ("id", "version", "superseded_by"):
            if getattr(m, name) is not None:
                check_int(getattr(m, name), f"memories[{i}].{name}", 1, 2**63 - 1)
        for old in m.history:
            if not {"version", "content", "created_at", "superseded_at"} <= old.keys():
                raise InvalidInputError(f"memories[{i}].history entries need version, content, created_at and superseded_at.", index=i)
    return items, stored

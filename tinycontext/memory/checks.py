"""Checks on what callers hand the engine: text, tags, session ids, ids and numeric settings.

Each check returns the cleaned value or raises a typed :class:`~tinycontext.errors.InvalidInputError`
(or the error a caller names) whose message says what is accepted, so the adapters pass it on as is.
"""

from __future__ import annotations

from typing import Sequence

import regex

from ..errors import InvalidInputError, MemoryNotFoundError

MAX_TAGS = 64
MAX_TAG_CHARS = 100
MAX_SESSION_CHARS = 200

# Text that shows nothing: whitespace of any script (U+3000 ...) and invisible format characters (U+200B ...).
BLANK = regex.compile(r"[\p{White_Space}\p{Default_Ignorable_Code_Point}]*")


def clean_text(value: str, what: str) -> str:
    if "\x00" in value:
        raise InvalidInputError(f"{what} contains a NUL character; remove it.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"{what} is not valid Unicode text (lone surrogate at {exc.start}); send UTF-8 text.") from exc
    return value


def normalise_tags(tags: Sequence[str], where: str) -> list[str]:
    # A bare string would otherwise be read as a list of one-letter tags.
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise InvalidInputError(f"{where}: tags must be a list of strings, got {type(tags).__name__}.")
    if len(tags) > MAX_TAGS:
        raise InvalidInputError(f"{where}: at most {MAX_TAGS} tags per memory.")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidInputError(f"{where}: tags must be strings, got {type(tag).__name__}.")
        tag = clean_text(tag, f"{where} tag").strip()
        if not tag or len(tag) > MAX_TAG_CHARS:
            raise InvalidInputError(f"{where}: tags must be 1-{MAX_TAG_CHARS} characters, got {tag[:20]!r}.")
        if tag not in out:
            out.append(tag)
    return out


def check_int(value, name: str, low: int, high: int, error: type[InvalidInputError] = InvalidInputError) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{name} must be an integer from {low} to {high}, got {value!r}.")
    return value


def check_number(value, name: str, low: float, high: float) -> float:
    # NaN fails the range test too.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidInputError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}.")
    return float(value)


def check_session(session_id: str | None) -> str | None:
    if session_id is None:
        return None
    if not isinstance(session_id, str) or not session_id.strip() or len(session_id) > MAX_SESSION_CHARS:
        raise InvalidInputError(f"session_id must be a non-empty string of at most {MAX_SESSION_CHARS} characters.")
    return clean_text(session_id, "session_id")


def check_query(query) -> str:
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be non-empty text: say what you want to remember.")
    return clean_text(query, "query")


def check_id(memory_id) -> int:
    if isinstance(memory_id, bool):
        raise InvalidInputError("id must be an integer memory id.")
    try:
        value = int(memory_id)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"id must be an integer memory id, got {memory_id!r}.") from exc
    if value < 1 or value >= 2**63:
        raise MemoryNotFoundError(f"No memory with id {value}.")
    return value

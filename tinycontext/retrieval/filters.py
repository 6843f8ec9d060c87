"""Recall and listing filters: parsing, validation and the SQL that applies them.

A filter is a JSON object; every key it has must hold, so keys combine with AND::

    {"tags_any": ["work", "home"],            # at least one of these tags
     "tags_all": ["python", "tooling"],       # every one of these tags
     "metadata": {"source": "chat", "n": 3},  # metadata key equals value (string, number, bool, null)
     "created_at": {"gte": "2025-01-01", "lt": "2025-02-01T12:00:00+02:00"},
     "updated_at": {"gt": "2025-03-01"},
     "occurred_at": {"gte": "2023-05-01", "lt": "2023-06-01"}}

Time operators are ``gt``, ``gte``, ``lt``, ``lte``; times are ISO 8601 dates or datetimes (naive ones
are UTC). :meth:`Filters.sql` renders the filter as one SQL condition on a memory id, so the engine
puts it inside BM25's FTS5 query and computes the dense search's allowed ids with it: a filtered
recall ranks only the memories that pass, it never filters a top-N cut afterwards. All values are
bound parameters; metadata keys are restricted to word characters, dots and dashes, so a key cannot
change a JSON path either.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidInputError

MAX_FILTER_VALUES = 64
MAX_METADATA_KEYS = 16
MAX_VALUE_CHARS = 1000
MAX_TTL_SECONDS = 100 * 366 * 86400
TIME_FIELDS = ("created_at", "updated_at", "occurred_at")
TIME_OPERATORS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_KEY = re.compile(r"^[\w.\-]{1,100}$", re.UNICODE)
# Stored timestamps are UTC ISO strings with microseconds (store.now_iso), so they compare as text.
_COLUMNS = {"created_at": "created_at", "updated_at": "coalesce(updated_at, created_at)"}
KEYS = ("tags_any", "tags_all", "metadata", *TIME_FIELDS)


def parse_time(value: Any, where: str) -> str:
    """An ISO 8601 date/datetime as the stored UTC text form; anything else is invalid_input."""
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise InvalidInputError(f"{where} must be an ISO 8601 date or datetime string such as '2025-01-31' or "
                                f"'2025-01-31T09:00:00Z', got {str(value)[:40]!r}.")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise InvalidInputError(f"{where}: {value[:40]!r} is not an ISO 8601 date or datetime ({exc}).") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def expiry(expires_at: Any, ttl_seconds: Any, where: str) -> str | None:
    """A memory's expiry as stored UTC text, from an ISO time or a TTL in seconds (not both)."""
    if expires_at is not None and ttl_seconds is not None:
        raise InvalidInputError(f"{where}: give expires_at or ttl_seconds, not both.")
    if ttl_seconds is not None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
            raise InvalidInputError(f"{where}.ttl_seconds must be an integer from 1 to {MAX_TTL_SECONDS}, got {ttl_seconds!r}.")
        return (datetime.now(timezone.utc) + timedelta(seconds=ttl_seconds)).isoformat(timespec="microseconds")
    return None if expires_at is None else parse_time(expires_at, f"{where}.expires_at")


def _tag_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise InvalidInputError(f"filters.{where} must be a list of tag strings, got {type(value).__name__}.")
    if len(value) > MAX_FILTER_VALUES:
        raise InvalidInputError(f"filters.{where} has {len(value)} tags; at most {MAX_FILTER_VALUES}.")
    out: list[str] = []
    for tag in value:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > MAX_VALUE_CHARS or "\x00" in tag:
            raise InvalidInputError(f"filters.{where} must hold non-empty tag strings, got {str(tag)[:40]!r}.")
        if tag.strip() not in out:
            out.append(tag.strip())
    return out


def _metadata(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"filters.metadata must be an object of key: value pairs, got {type(value).__name__}.")
    if len(value) > MAX_METADATA_KEYS:
        raise InvalidInputError(f"filters.metadata has {len(value)} keys; at most {MAX_METADATA_KEYS}.")
    out: dict[str, Any] = {}
    for key, expected in value.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise InvalidInputError(f"filters.metadata key {str(key)[:40]!r} is not allowed: use 1-100 letters, digits, "
                                    "'_', '-' or '.' (a dotted key reaches into nested objects).")
        if isinstance(expected, float) and expected != expected:
            raise InvalidInputError(f"filters.metadata.{key} is NaN; compare with a real number.")
        if expected is not None and not isinstance(expected, (str, int, float, bool)):
            raise InvalidInputError(f"filters.metadata.{key} must be a string, number, boolean or null to compare "
                                    f"for equality, got {type(expected).__name__}.")
        if isinstance(expected, str) and (len(expected) > MAX_VALUE_CHARS or "\x00" in expected):
            raise InvalidInputError(f"filters.metadata.{key} must be at most {MAX_VALUE_CHARS} characters without NUL.")
        out[key] = expected
    return out


def parse_occurred_at(value: Any, where: str) -> str | None:
    """ISO 8601 text for a date or date-time (a ``datetime``/``date`` is accepted too).

    Kept as the caller's precision: ``2023-05-08`` stays a date, ``2023-05-08T13:56`` a local time,
    an offset is kept. Sorting the stored text sorts by time for values written the same way.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds" if value.second or value.microsecond else "minutes")
    if isinstance(value, date):
        return value.isoformat()
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{where}.occurred_at must be ISO 8601 text such as 2023-05-08 or 2023-05-08T13:56, got {value!r}.")
    text = value.strip()
    try:
        if len(text) == 10:
            return date.fromisoformat(text).isoformat()
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInputError(f"{where}.occurred_at is not an ISO 8601 date or time: {value!r} ({exc}).") from exc
    if parsed.tzinfo is not None and parsed.utcoffset() == timezone.utc.utcoffset(None):
        return parsed.isoformat(timespec="minutes" if not parsed.second else "seconds").replace("+00:00", "Z")
    return parsed.isoformat(timespec="minutes" if not parsed.second and not parsed.microsecond else "seconds")


def _bound(name: str, moment: Any, where: str) -> str:
    if name == "occurred_at":
        # Stored at the caller's precision (parse_occurred_at): compare in that same form.
        if not isinstance(moment, str):
            raise InvalidInputError(f"{where} must be an ISO 8601 date or datetime string, got {str(moment)[:40]!r}.")
        return parse_occurred_at(moment, where)
    return parse_time(moment, where)


def _range(value: Any, name: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not value:
        raise InvalidInputError(f"filters.{name} must be an object like {{\"gte\": \"2025-01-01\", \"lt\": \"2025-02-01\"}}.")
    out: dict[str, str] = {}
    for op, moment in value.items():
        if moment is None:
            continue
        if op not in TIME_OPERATORS:
            raise InvalidInputError(f"filters.{name}: unknown operator {str(op)[:20]!r}; use {', '.join(TIME_OPERATORS)}.")
        out[op] = _bound(name, moment, f"filters.{name}.{op}")
    return out


@dataclass(frozen=True)
class Filters:
    """A validated filter. Empty (the default) lets every memory through."""

    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    metadata: tuple[tuple[str, Any], ...] = ()
    times: tuple[tuple[str, str, str], ...] = ()  # (field, operator, UTC ISO text)

    def __bool__(self) -> bool:
        return bool(self.tags_any or self.tags_all or self.metadata or self.times)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {}
        if self.tags_any:
            out["tags_any"] = list(self.tags_any)
        if self.tags_all:
            out["tags_all"] = list(self.tags_all)
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        for name, op, moment in self.times:
            out.setdefault(name, {})[op] = moment
        return out

    def sql(self, id_column: str) -> tuple[str, list]:
        """``(condition, params)``: a condition true for ids that pass, or ``("", [])`` when empty."""
        if not self:
            return "", []
        parts: list[str] = []
        params: list = []
        row_checks: list[str] = []
        if self.tags_any:
            parts.append(f"{id_column} IN (SELECT memory_id FROM memory_tags WHERE tag IN ({','.join('?' * len(self.tags_any))}))")
            params += self.tags_any
        if self.tags_all:
            parts.append(f"{id_column} IN (SELECT memory_id FROM memory_tags WHERE tag IN ({','.join('?' * len(self.tags_all))}) "
                         "GROUP BY memory_id HAVING count(*) = ?)")
            params += [*self.tags_all, len(self.tags_all)]
        row_params: list = []
        for key, expected in self.metadata:
            path = "$." + ".".join(f'"{part}"' for part in key.split("."))
            if expected is None:
                row_checks.append("json_type(metadata, ?) = 'null'")
                row_params.append(path)
            elif isinstance(expected, bool):
                row_checks.append("json_type(metadata, ?) = ?")
                row_params += [path, "true" if expected else "false"]
            elif isinstance(expected, str):
                row_checks.append("(json_type(metadata, ?) = 'text' AND json_extract(metadata, ?) = ?)")
                row_params += [path, path, expected]
            else:
                row_checks.append("(json_type(metadata, ?) IN ('integer', 'real') AND json_extract(metadata, ?) = ?)")
                row_params += [path, path, expected]
        for name, op, moment in self.times:
            row_checks.append(f"{_COLUMNS.get(name, name)} {TIME_OPERATORS[op]} ?")
            row_params.append(moment)
        if row_checks:
            parts.append(f"{id_column} IN (SELECT id FROM memories WHERE {' AND '.join(row_checks)})")
            params += row_params
        return " AND ".join(parts), params


class TimeRange(BaseModel):
    """Bounds on a timestamp: ISO 8601 dates or datetimes (naive ones are UTC)."""

    model_config = ConfigDict(extra="forbid")
    gt: str | None = Field(None, description="after")
    gte: str | None = Field(None, description="at or after")
    lt: str | None = Field(None, description="before")
    lte: str | None = Field(None, description="at or before")


class FilterSpec(BaseModel):
    """The filter's JSON shape, for MCP and REST schemas; :func:`parse_filters` does the validation."""

    model_config = ConfigDict(extra="forbid")
    tags_any: list[str] | None = Field(None, max_length=MAX_FILTER_VALUES, description="Keep memories with at least one of these tags.")
    tags_all: list[str] | None = Field(None, max_length=MAX_FILTER_VALUES, description="Keep memories with every one of these tags.")
    metadata: dict[str, str | int | float | bool | None] | None = Field(
        None, description='Metadata equality, e.g. {"source": "chat"}; a dotted key reaches into nested objects.')
    created_at: TimeRange | None = Field(None, description='Saved within, e.g. {"gte": "2025-01-01", "lt": "2025-02-01"}.')
    updated_at: TimeRange | None = Field(None, description="Last changed within.")
    occurred_at: TimeRange | None = Field(None, description="Happened within (compared at the precision it was saved with).")


def parse_filters(raw: Mapping | FilterSpec | Filters | str | None, *, time_fields: tuple[str, ...] = TIME_FIELDS) -> Filters:
    """Validate a filter object (or its JSON text). Anything unexpected raises invalid_input."""
    if raw is None or isinstance(raw, Filters):
        return raw or Filters()
    if isinstance(raw, BaseModel):
        raw = raw.model_dump(exclude_unset=True)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"filters is not valid JSON ({exc.msg}); pass an object like {{\"tags_all\": [\"a\", \"b\"]}}.") from exc
    if not isinstance(raw, Mapping):
        raise InvalidInputError(f"filters must be an object with keys among {', '.join(KEYS)}; got {type(raw).__name__}.")
    allowed = ("tags_any", "tags_all", "metadata", *time_fields)
    unknown = [str(k)[:40] for k in raw if k not in allowed]
    if unknown:
        raise InvalidInputError(f"filters: unknown key(s) {', '.join(map(repr, unknown))}; use {', '.join(allowed)}.")
    times = tuple((name, op, moment) for name in time_fields if raw.get(name) is not None
                  for op, moment in _range(raw[name], name).items())
    return Filters(
        tags_any=tuple(_tag_list(raw["tags_any"], "tags_any")) if raw.get("tags_any") is not None else (),
        tags_all=tuple(_tag_list(raw["tags_all"], "tags_all")) if raw.get("tags_all") is not None else (),
        metadata=tuple(_metadata(raw["metadata"]).items()) if raw.get("metadata") is not None else (),
        times=times,
    )

"""The reference MCP memory server's knowledge graph (modelcontextprotocol/servers, src/memory): a
JSONL file (``memory.jsonl``, ``memory.json`` in older versions), one object per line:

* ``{"type": "entity", "name": ..., "entityType": ..., "observations": [str, ...]}``
* ``{"type": "relation", "from": ..., "to": ..., "relationType": ...}``

Each observation becomes a memory ``"<name>: <observation>"`` tagged with the entity type; an entity
without observations becomes one memory naming it; each relation becomes a memory ``"<from>
<relation type> <to>"`` tagged ``relation``. The graph has no timestamps, so memories are dated by
the import. The uid hashes the entity and observation text (or the relation's three parts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ..engine import MemoryEngine
from .base import Pending, bad, json_lines, source_uid

NAME = "mcp-memory"


def _text(record: dict, key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise bad(where, f"a {record.get('type')} line needs {key!r} (a non-empty string).")
    return value.strip()


def _memories(record: dict, where: str, session_id: str | None) -> Iterator[Pending]:
    kind = record.get("type")
    if kind == "entity":
        name, entity_type = _text(record, "name", where), _text(record, "entityType", where)
        observations = record.get("observations", [])
        if not isinstance(observations, list) or not all(isinstance(o, str) for o in observations):
            raise bad(where, "observations must be a list of strings.")
        meta = {"source": NAME, "entity": name, "entity_type": entity_type}
        kept = [o.strip() for o in observations if o.strip()]
        for observation in kept:
            yield Pending(where, session_id, {"content": f"{name}: {observation}", "tags": [entity_type], "metadata": meta,
                                              "uid": source_uid(NAME, "entity", name, observation)})
        if not kept:
            yield Pending(where, session_id, {"content": f"{name} ({entity_type})", "tags": [entity_type], "metadata": meta,
                                              "uid": source_uid(NAME, "entity", name)})
    elif kind == "relation":
        source, target, relation = (_text(record, k, where) for k in ("from", "to", "relationType"))
        yield Pending(where, session_id, {
            "content": f"{source} {relation.replace('_', ' ')} {target}", "tags": ["relation"],
            "metadata": {"source": NAME, "relation": relation, "from": source, "to": target},
            "uid": source_uid(NAME, "relation", source, relation, target)})
    else:
        raise bad(where, f"unknown line type {kind!r}; the MCP memory server writes 'entity' and 'relation' lines.")


def read(engine: MemoryEngine, path: Path, session_id: str | None = None) -> Iterator[Pending]:
    if path.is_dir():
        raise bad(str(path), "is a folder; give the memory server's memory.jsonl file.")
    try:
        with open(path, encoding="utf-8") as fh:
            for _, where, record in json_lines(fh, str(path), "expected one entity or relation per line"):
                if not isinstance(record, dict):
                    raise bad(where, "expected a JSON object (an entity or a relation).")
                yield from _memories(record, where, session_id)
    except UnicodeDecodeError as exc:
        raise bad(str(path), f"is not UTF-8 text ({exc}).") from exc

"""mem0's memories (mem0ai/mem0), from any of the JSON shapes it hands out:

* what ``Memory.get_all()`` / ``MemoryClient.get_all()`` return, saved as JSON: ``{"results": [...]}``
  or a bare list of ``{"id", "memory", "hash", "metadata", "categories", "created_at", "updated_at",
  "user_id", "agent_id", "app_id", "run_id", ...}``;
* OpenMemory's export (``POST /api/v1/backup/export``): the zip, its ``memories.json`` (``{"memories":
  [{"id", "content", "metadata", "state", "created_at", "updated_at", "category_ids", ...}],
  "categories": [{"id", "name"}, ...], ...}``) or its ``memories.jsonl.gz`` (one ``{"id", "content",
  "metadata", "state", "app", "categories": [names], ...}`` per line).

The text becomes the memory, categories its tags, the dates are kept, and the metadata keeps mem0's
own plus ``source``, ``source_id`` and who it belongs to (``user_id``, ``agent_id``, ``app_id``,
``run_id``, ``app``, ``state``). Memories OpenMemory marks deleted are not imported. The uid hashes mem0's id.
"""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path
from typing import Iterator

from ..engine import MemoryEngine
from .base import IGNORED, Pending, bad, check_time, json_lines, parse_json, source_uid

NAME = "mem0"
OWNERS = ("user_id", "agent_id", "app_id", "run_id", "actor_id", "role", "app")


def _memory(record, where: str, session_id: str | None, categories: dict[str, str]):
    if not isinstance(record, dict):
        raise bad(where, "expected a memory object.")
    if record.get("state") == "deleted":
        return IGNORED
    content = record.get("memory", record.get("content"))
    if not isinstance(content, str):
        raise bad(where, "a mem0 memory needs its text in 'memory' (or 'content' in OpenMemory's export).")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise bad(where, "metadata must be an object.")
    names = record.get("categories")
    if names is None:
        names = [categories.get(str(c), str(c)) for c in record.get("category_ids") or []]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad(where, "categories must be a list of names.")
    native = record.get("id")
    metadata = {**metadata, "source": NAME, **({"source_id": str(native)} if native is not None else {}),
                **{k: record[k] for k in OWNERS if record.get(k) is not None}}
    if record.get("state") not in (None, "active"):
        metadata["state"] = record["state"]
    memory = {"content": content, "tags": [n for n in names if n.strip()], "metadata": metadata,
              "uid": source_uid(NAME, native) if native is not None else source_uid(NAME, content, record.get("created_at"))}
    for key in ("created_at", "updated_at"):
        if record.get(key) is not None:
            memory[key] = check_time(record[key], key, where)
    return Pending(where, session_id, memory)


def _document(data, where: str) -> tuple[list, dict[str, str], str]:
    """The memory list of a JSON document, OpenMemory's category names by id, and the list's name."""
    if isinstance(data, list):
        return data, {}, ""
    if isinstance(data, dict):
        for key in ("results", "memories"):
            if isinstance(data.get(key), list):
                categories = {str(c.get("id")): c.get("name") for c in data.get("categories") or [] if isinstance(c, dict)}
                return data[key], {k: v for k, v in categories.items() if isinstance(v, str)}, key
    raise bad(where, "expected a list of mem0 memories, or an object with 'results' (get_all) or 'memories' (OpenMemory export).")


def _lines(lines, where: str, session_id: str | None) -> Iterator:
    for _, at, record in json_lines(lines, where):
        yield _memory(record, at, session_id, {})


def read(engine: MemoryEngine, path: Path, session_id: str | None = None) -> Iterator:
    where = str(path)
    if path.is_dir():
        raise bad(where, "is a folder; give mem0's JSON export (or OpenMemory's export zip).")
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = {n.rsplit("/", 1)[-1]: n for n in archive.namelist() if not n.endswith("/")}
                if "memories.json" not in names:
                    raise bad(where, "this zip has no memories.json; is it OpenMemory's export?")
                text, where = archive.read(names["memories.json"]).decode("utf-8"), f"{path}!memories.json"
        elif path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                yield from _lines(fh, where, session_id)
            return
        else:
            text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise bad(where, f"cannot be read as mem0's export ({exc}).") from exc
    if path.suffix == ".jsonl":
        yield from _lines(text.splitlines(), where, session_id)
        return
    records, categories, key = _document(parse_json(text, where), where)
    for i, record in enumerate(records):
        yield _memory(record, f"{where}: {key or 'memories'}[{i}]", session_id, categories)

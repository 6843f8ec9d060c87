"""basic-memory's knowledge base (basicmachines-co/basic-memory): a folder of Markdown notes, each with
YAML frontmatter (``title``, ``type``, ``tags``, ``permalink``) and, in list items anywhere in its body,
observations and relations as basic-memory's parser reads them:

* observation: ``- [category] text #tag1 #tag2 (context)`` (or a list item with a ``#tag``);
* relation: ``- relation_type [[Target]] (context)`` (``relates_to`` when no type is written).

Each observation becomes a memory ``"<title>: <text>"`` tagged with its category, its ``#tags`` and the
note's tags; each relation a memory ``"<title> <relation type> <Target>"`` tagged ``relation``; the
rest of the note's text (headings, paragraphs, other list items) one memory per part of up to
``PART_CHARS`` characters, split between paragraphs. Memories are dated by the note file's modification
time, as basic-memory dates its entities. The metadata names the note (``note``, ``permalink``,
``note_type``) and the observation's ``category`` and ``context``. The uid hashes the note's permalink
with the observation, relation or text.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import yaml

from ..engine import MemoryEngine
from .base import Pending, bad, source_uid

NAME = "basic-memory"
PART_CHARS = 2000
_ITEM = re.compile(r"^\s*[-*+]\s+(.*\S)\s*$")
_OBSERVATION = re.compile(r"^\[([^\[\]()]+)\]\s+(.+)")
_TASK = re.compile(r"^\[[ xX-]\]")
_LINK_ONLY = re.compile(r"^\[.*?\]\(.*?\)$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_STRUCTURE = {"observations", "relations"}


def _tags(raw, where: str) -> list[str]:
    """Frontmatter tags as basic-memory reads them: a list, or one comma-separated string; '#' dropped."""
    if raw is None:
        return []
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list) else None
    if items is None:
        raise bad(where, f"frontmatter tags must be a list or a comma-separated string, got {type(raw).__name__}.")
    return [str(t).strip().lstrip("#") for t in items if str(t).strip().lstrip("#")]


def _frontmatter(lines: list[str], where: str) -> tuple[dict, int]:
    """The note's YAML frontmatter and the index of its first body line."""
    if not lines or lines[0].strip() != "---":
        return {}, 0
    end = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
    if end is None:
        raise bad(f"{where}:1", "the frontmatter opened with '---' is never closed.")
    try:
        data = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise bad(f"{where}:{mark.line + 2 if mark else 1}", f"the frontmatter is not valid YAML ({getattr(exc, 'problem', exc)}).") from exc
    if not isinstance(data, dict):
        raise bad(f"{where}:1", "the frontmatter must be a YAML mapping (title: ..., tags: ...).")
    return data, end + 1


def _observation(text: str) -> dict | None:
    match = _OBSERVATION.match(text)
    if not match and not any(part.startswith("#") and len(part) > 1 for part in text.split()):
        return None
    category, content = (match.group(1).strip(), match.group(2).strip()) if match else (None, text)
    context = None
    if content.endswith(")") and "(" in content:
        start = content.rfind("(")
        context, content = content[start + 1:-1].strip() or None, content[:start].strip()
    tags = [t for part in content.split() if part.startswith("#") for t in part.split("#") if t]
    return {"category": category, "content": content, "tags": tags, "context": context}


def _relation(text: str) -> dict | None:
    start, end = text.find("[["), text.find("]]")
    if start == -1 or end < start or not text[start + 2:end].strip():
        return None
    after = text[end + 2:].strip()
    return {"type": text[:start].strip() or "relates_to", "target": text[start + 2:end].strip(),
            "context": after[1:-1].strip() or None if after.startswith("(") and after.endswith(")") else None}


def _parts(paragraphs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Paragraphs joined into parts of up to PART_CHARS characters: (first line number, text)."""
    parts: list[tuple[int, str]] = []
    for line, text in paragraphs:
        if parts and len(parts[-1][1]) + 2 + len(text) <= PART_CHARS:
            parts[-1] = (parts[-1][0], parts[-1][1] + "\n\n" + text)
        else:
            parts.append((line, text))
    return parts


def _note(path: Path, root: Path, session_id: str | None) -> Iterator[Pending]:
    where = str(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise bad(where, f"is not UTF-8 text ({exc}).") from exc
    front, body = _frontmatter(lines, where)
    title = str(front.get("title") or path.stem)
    permalink = str(front.get("permalink") or path.relative_to(root).with_suffix("").as_posix())
    note_tags = _tags(front.get("tags"), f"{where}:1")
    note = {"source": NAME, "note": title, "permalink": permalink, "note_type": str(front.get("type") or "note")}
    dated = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="microseconds")
    stamp = {"created_at": dated, "updated_at": dated}
    paragraphs: list[tuple[int, str]] = []
    current: list[str] = []
    fenced = False

    def close_paragraph(number: int) -> None:
        if current:
            paragraphs.append((number - len(current), "\n".join(current)))
            current.clear()

    for number, line in enumerate(lines[body:], body + 1):
        item = None if fenced else _ITEM.match(line)
        if _FENCE.match(line):
            fenced = not fenced
        text = item.group(1) if item else ""
        found = None
        if item and not _TASK.match(text) and not _LINK_ONLY.match(text):
            found = ("observation", _observation(text)) if _OBSERVATION.match(text) else ("relation", _relation(text))
            if found[1] is None:
                found = ("observation", _observation(text))
        if found and found[1] is not None:
            close_paragraph(number)
            kind, parsed = found
            if kind == "observation":
                meta = {**note, **{k: parsed[k] for k in ("category", "context") if parsed[k]}}
                tags = ([parsed["category"]] if parsed["category"] else []) + parsed["tags"] + note_tags
                yield Pending(f"{where}:{number}", session_id, {
                    "content": f"{title}: {parsed['content']}", "tags": tags, "metadata": meta, **stamp,
                    "uid": source_uid(NAME, permalink, "observation", parsed["category"], parsed["content"])})
            else:
                meta = {**note, "relation": parsed["type"], "to": parsed["target"], **({"context": parsed["context"]} if parsed["context"] else {})}
                yield Pending(f"{where}:{number}", session_id, {
                    "content": f"{title} {parsed['type'].replace('_', ' ')} {parsed['target']}", "tags": ["relation"], "metadata": meta,
                    **stamp, "uid": source_uid(NAME, permalink, "relation", parsed["type"], parsed["target"])})
        elif not line.strip():
            close_paragraph(number)
        elif not (line.lstrip().startswith("#") and line.strip("# ").lower() in _STRUCTURE | {title.lower()}):
            current.append(line.rstrip())
    close_paragraph(len(lines) + 1)
    for line, text in _parts(paragraphs):
        yield Pending(f"{where}:{line}", session_id, {"content": f"{title}\n\n{text}", "tags": note_tags, "metadata": note, **stamp,
                                                      "uid": source_uid(NAME, permalink, "text", text)})


def read(engine: MemoryEngine, path: Path, session_id: str | None = None) -> Iterator[Pending]:
    """Every ``*.md`` note under the folder ``path`` (or the one note ``path``), in path order."""
    if path.is_dir():
        notes = sorted(p for p in path.rglob("*.md") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not notes:
            raise bad(str(path), "has no Markdown notes (*.md); give basic-memory's project folder.")
        root = path
    else:
        notes, root = [path], path.parent
    for note in notes:
        yield from _note(note, root, session_id)

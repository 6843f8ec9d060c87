"""What the ``tinycontext`` subcommands share: the command registry (``@command``), the config and
engine of a call, ``--json`` output, and reading memories and filters from the command line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..config import TinyContextConfig, load_config
from ..errors import InvalidInputError
from ..memory.engine import MemoryEngine

NOTES_SHOWN = 5  # per kind of note; the rest are counted (--json lists them all)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None] = lambda parser: None):
    """Register ``run(args) -> exit code | None`` as subcommand ``name``."""

    def register(run):
        COMMANDS[name] = Command(name, help, configure, run)
        return run

    return register


# -- shared helpers ---------------------------------------------------------------------------


def config_of(args: argparse.Namespace, **updates) -> TinyContextConfig:
    config = load_config(args.config)
    return config.model_copy(update=updates) if updates else config


@contextmanager
def open_engine(args: argparse.Namespace, **updates) -> Iterator[MemoryEngine]:
    # One-shot commands own their engine and close it; progress bars (stderr) show for long batches.
    with MemoryEngine(config_of(args, **updates), progress=True) as engine:
        yield engine


def emit(args: argparse.Namespace, data, text: str) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2) if args.json else text)


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")


def parse_metadata(raw: str | None) -> dict | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"--metadata is not valid JSON ({exc}); pass an object like '{{\"source\": \"chat\"}}'.") from exc
    if not isinstance(value, dict):
        raise InvalidInputError("--metadata must be a JSON object, like '{\"source\": \"chat\"}'.")
    return value


def add_filter_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--filter", metavar="JSON", help='filter object, e.g. \'{"tags_all": ["a", "b"], "created_at": {"gte": "2025-01-01"}}\'')
    parser.add_argument("--all-tag", action="append", default=[], help="keep memories with every one of these tags (repeatable)")
    parser.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                        help="keep memories whose metadata KEY equals VALUE (JSON value, else text; repeatable)")
    parser.add_argument("--since", help="saved at or after this ISO date/time")
    parser.add_argument("--until", help="saved before this ISO date/time")


def filters_of(args: argparse.Namespace) -> dict | None:
    """The --filter object with the shorthand flags merged in (the flags win)."""
    try:
        filters = json.loads(args.filter) if args.filter else {}
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"--filter is not valid JSON ({exc.msg}).") from exc
    if not isinstance(filters, dict) or not all(isinstance(filters.get(k, {}), (dict, list)) for k in ("metadata", "created_at", "tags_all")):
        raise InvalidInputError("--filter must be a JSON object like '{\"tags_all\": [\"a\"]}'.")
    if args.all_tag:
        filters["tags_all"] = [*filters.get("tags_all", []), *args.all_tag]
    for pair in args.meta:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise InvalidInputError(f"--meta {pair!r}: write KEY=VALUE.")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        filters.setdefault("metadata", {})[key] = value
    for flag, op in (("since", "gte"), ("until", "lt")):
        if getattr(args, flag):
            filters.setdefault("created_at", {})[op] = getattr(args, flag)
    return filters or None


def read_memories(text: str) -> list:
    """Memories from stdin: a JSON memory, a list of them, {"memories": [...]}, or JSONL (one per line)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    data.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InvalidInputError(
                        f"stdin line {number} is not JSON ({exc.msg}). Send a JSON memory {{\"content\": ...}}, "
                        "a list of them, or JSONL with one per line.") from exc
    if isinstance(data, dict) and "memories" in data:
        data = data["memories"]
    return data if isinstance(data, list) else [data]


def with_defaults(memory, tags: list[str], metadata: dict | None):
    """Add the command line's --tag/--metadata to a memory read from stdin (its own values win)."""
    if isinstance(memory, str):
        memory = {"content": memory}
    if not isinstance(memory, dict):
        return memory  # the engine reports what is wrong with it
    own_tags, own_metadata = memory.get("tags", []), memory.get("metadata", {})
    if isinstance(own_tags, str):  # {"tags": "prefs"} means one tag, not five letters
        own_tags = [own_tags]
    if not isinstance(own_tags, list) or not isinstance(own_metadata, dict):
        return memory  # e.g. null tags or metadata: the engine says what is wrong
    return {**memory, "tags": [*own_tags, *tags], "metadata": {**(metadata or {}), **own_metadata}}



def id_ranges(ids: list[int]) -> str:
    """``3, 5-9, 12``: consecutive ids as ranges (a bulk save gets one line, not thousands of numbers)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(shown) > NOTES_SHOWN * 4:
        return ", ".join(shown[:NOTES_SHOWN * 4]) + f", ... ({len(ids)} in all; --json lists them)"
    return ", ".join(shown)


def summarised(lines: list[str], what: str) -> list[str]:
    """The first few of many similar lines, then how many more there are."""
    if len(lines) <= NOTES_SHOWN + 1:
        return lines
    return [*lines[:NOTES_SHOWN], f"  ... and {len(lines) - NOTES_SHOWN} more {what} (--json lists them all)"]

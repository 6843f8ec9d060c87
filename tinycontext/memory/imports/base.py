"""What every import shares: the report, the checks with the record's place in the file, and the run
that checks everything first and then writes it all in one transaction (or, for a dry run, rolls it back).

A reader yields :class:`Pending` memories (and, for TinyContext exports, ``("session", id, created_at,
where)`` tuples). Each memory carries a stable ``uid`` derived from its source's own identity, so the
engine skips one imported before: importing the same file twice adds nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Iterator

from ..checks import check_session
from ..engine import MemoryEngine
from ...errors import InvalidInputError, StorageError
from ...retrieval import postings
from ...retrieval.filters import parse_time

CHUNK = 256  # memories per engine call on import: bounded memory, one transaction for the whole file
# An import of this many memories, and of at least OPTIMIZE_SHARE of the database's memories after it, ends by
# merging the full-text index (Store.optimize): one big transaction leaves it in many segments. The merge
# rewrites the whole index (8.7 s at 1M memories, where importing them took 187 s: notes/bench_scale.md), so
# a small import into a big database leaves it to FTS5's own merging or `tinycontext optimize`.
OPTIMIZE_AFTER = 10_000
OPTIMIZE_SHARE = 0.1
MAX_INTEGER = 2**63 - 1  # SQLite's INTEGER

log = logging.getLogger(__name__)


@dataclass
class ImportReport:
    source: str
    format: str = "tinycontext"
    dry_run: bool = False  # True: counted as if imported, nothing written
    imported: int = 0
    skipped: int = 0  # already present: same uid (imported before), or the same text in the session
    ignored: int = 0  # records the source itself marks deleted, which are not imported
    embedded: int = 0  # memories whose vector had to be computed
    history: int = 0  # old versions carried over
    sessions: int = 0
    renumbered: dict[int, int] = field(default_factory=dict)
    new_ids: list[int] = field(default_factory=list, repr=False)  # what this import wrote (not reported)

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "new_ids"}
        return {**out, "renumbered": {str(k): v for k, v in self.renumbered.items()}}


@dataclass
class Pending:
    """One memory to import: where it came from (for error messages), its session, and the
    :class:`~tinycontext.memory.engine.StoredMemory` fields."""

    where: str
    session_id: str | None
    memory: dict


class Ignored:
    """A record the source marks deleted: counted in the report, not imported."""


IGNORED = Ignored()


def bad(where: str, message: str) -> InvalidInputError:
    return InvalidInputError(f"{where}: {message}")


def parse_json(text: str, where: str, expected: str = ""):
    """One JSON document; a bad one is ``invalid_input`` at ``where``, ending with what was ``expected``."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise bad(where, f"not JSON ({getattr(exc, 'msg', 'nested too deeply')}){'; ' + expected if expected else ''}.") from exc


def json_lines(lines: Iterable[str], source: str, expected: str = "") -> Iterator[tuple[int, str, object]]:
    """(line number, ``source:number``, parsed record) for each non-blank line of a JSON-lines file."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            where = f"{source}:{number}"
            yield number, where, parse_json(line, where, expected)


def check_time(value, name: str, where: str) -> str:
    """An ISO 8601 date or time, kept as written (an import copies the source's text exactly)."""
    try:
        parse_time(value, name)
    except InvalidInputError as exc:
        raise bad(where, exc.message) from exc
    return value


def epoch_time(value, name: str, where: str) -> str:
    """A Unix time in seconds (as some tools store it) as ISO 8601 UTC."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 253402300800:
        raise bad(where, f"{name} must be a Unix time in seconds, got {str(value)[:40]}.")
    return datetime.fromtimestamp(value, timezone.utc).isoformat(timespec="microseconds")


def integer(value, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INTEGER:
        raise bad(where, f"{name} must be an integer from 1 to {MAX_INTEGER}, got {str(value)[:40]}.")
    return value


def source_uid(prefix: str, *parts) -> str:
    """The stable identity of a memory read from another tool: the format and the source's own key
    (an id, or what identifies the record there), hashed. The same record always gets the same uid."""
    return f"{prefix}:" + hashlib.sha256("\x00".join(map(str, parts)).encode("utf-8")).hexdigest()[:32]


def decode_vector(raw, dims: int, where: str) -> bytes | None:
    """A record's vector as float32 bytes of this embedder's size (None: absent or another size, so
    the text is embedded again). Whether its values are finite the engine checks, once, on import."""
    if raw is None:
        return None
    try:
        blob = base64.b64decode(raw, validate=True) if isinstance(raw, str) else bytes(raw)
    except (ValueError, TypeError) as exc:
        raise bad(where, f"vector is not base64 ({exc}).") from exc
    return blob if len(blob) == dims * 4 else None


def _check(engine: MemoryEngine, pending: Pending) -> None:
    """The engine's own checks of one memory (content, tags, metadata, times ...), with its place."""
    try:
        engine.check_import([pending.memory])
    except InvalidInputError as exc:
        message = exc.message.removeprefix("memories[0]").removeprefix("memories are malformed: ").lstrip(".: ")
        raise bad(pending.where, message) from exc


def _import_chunk(engine: MemoryEngine, chunk: list[Pending], report: ImportReport) -> None:
    """Each session's memories go through the engine's write path (joining the import's transaction)."""
    by_session: dict[str | None, list[Pending]] = {}
    for pending in chunk:
        by_session.setdefault(pending.session_id, []).append(pending)
    for session, group in by_session.items():
        try:
            result = engine.import_memories([p.memory for p in group], session_id=session)
        except InvalidInputError as exc:
            index = exc.details.get("index")
            if index is None:  # the chunk's check does not say which record: check them one by one to name it
                for pending in group:
                    _check(engine, pending)
            raise bad(group[index].where if index is not None else group[0].where, exc.message) from exc
        report.imported += len(result["ids"])
        report.new_ids += result["ids"]
        report.skipped += len(result["skipped"])
        report.embedded += result["embedded"]
        report.renumbered.update(result["renumbered"])
        kept = {s["index"] for s in result["saved"]}
        report.history += sum(len(p.memory.get("history") or []) for i, p in enumerate(group) if i in kept)


class _DryRun(Exception):
    """Raised inside the import's transaction to roll it back once everything was counted."""


def run(engine: MemoryEngine, items: Callable[[], Iterable], report: ImportReport) -> ImportReport:
    """Check and write every record in one transaction, a chunk at a time: a bad record anywhere in
    a file rolls back all of it, so it imports nothing and an interrupted import leaves nothing half
    done. A dry run (``report.dry_run``) does the same work and rolls the transaction back, so its
    counts are what the import would do and the database is left as it was."""
    chunk: list[Pending] = []
    try:
        with engine.store.bulk(), engine.index.write():
            for item in items():
                if item is IGNORED:
                    report.ignored += 1
                    continue
                if isinstance(item, tuple):  # a session record: make sure it exists with its original date
                    try:
                        report.sessions += engine.ensure_session(item[1], created_at=item[2])
                    except InvalidInputError as exc:
                        raise bad(item[3], exc.message) from exc
                    continue
                chunk.append(item)
                if len(chunk) >= CHUNK:
                    _import_chunk(engine, chunk, report)
                    chunk = []
            if chunk:
                _import_chunk(engine, chunk, report)
            if report.renumbered:  # links between imported facts follow their new ids
                engine.renumber_links(report.new_ids, report.renumbered)
            if report.dry_run:
                raise _DryRun
    except _DryRun:
        pass
    if not report.dry_run and not engine.store.writing and report.imported >= OPTIMIZE_AFTER:
        _optimize(engine, report)
    return report


def _optimize(engine: MemoryEngine, report: ImportReport) -> None:
    """Merge the full-text index after the import committed (in its own transaction: not when the import
    joined a caller's, which it would lengthen). The import stands whatever happens here."""
    if report.imported < OPTIMIZE_SHARE * engine.store.count_memories():
        return
    try:
        with engine.index.write():  # the merge changes no vector: the in-RAM copy the import kept stays current
            engine.store.optimize(postings_from=postings.IMPORT_MIN_MEMORIES)
    except StorageError as exc:  # e.g. another writer held the lock past the timeout
        log.warning("Imported %d memories; merging the full-text index afterwards failed (%s). Searches are unaffected; "
                    "`tinycontext optimize` merges it later.", report.imported, exc)

"""The memory engine: saving, recalling, editing memories in one SQLite file.

``MemoryEngine`` holds an open store and an embedder loaded on first use. The module-level functions
(``save_memories``, ``recall_memories``, ...) reuse one engine per configuration, so a process pays
for opening the database and loading the model once.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import unicodedata
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from typing import Any, Iterable, Sequence

import numpy as np
import regex
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import browse, codes, facts, keyword_mode as keyword
from ..retrieval import conversation, language, time_windows as when
from ..budget.tokens import TokenCounter, fit_budget
from ..config import TinyContextConfig
from ..models import backends
from ..models.backends import NO_MODEL, EmbedderProtocol
from ..errors import (
    ConflictError,
    EmptyMemoryError,
    InvalidInputError,
    MemoryNotFoundError,
    RecallBudgetError,
    SessionNotFoundError,
)
from ..retrieval.filters import Filters, expiry, parse_filters, parse_occurred_at, parse_time
from ..budget.render import Page, check_agent_budget, check_detail, recall_page
from ..retrieval.bounded_bm25 import bounded_match
from ..retrieval.fusion import Signals, cliff_cut, fuse, relevance_floor
from .store import MEMORY_COLUMNS, Store, insert_vectors, now_iso, row_to_memory, typed_storage_errors
from .vector_index import VectorIndex

DEFAULT_SESSION = "default"
_QUERY_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tinycontext-query")
MAX_TAGS = 64
MAX_TAG_CHARS = 100
MAX_METADATA_BYTES = 64_000
MAX_METADATA_DEPTH = 16
MAX_SESSION_CHARS = 200
MAX_OFFSET = 1_000_000
# sqlite-vec refuses KNN queries with k above this; deeper dense candidate lists are cut to it.
VEC_KNN_MAX = 4096
_UNOPENED = object()  # the embedder before its first use


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


# Text that shows nothing: whitespace of any script (U+3000 ...) and invisible format characters (U+200B ...).
_BLANK = regex.compile(r"[\p{White_Space}\p{Default_Ignorable_Code_Point}]*")


def _clean_text(value: str, what: str) -> str:
    if "\x00" in value:
        raise InvalidInputError(f"{what} contains a NUL character; remove it.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"{what} is not valid Unicode text (lone surrogate at {exc.start}); send UTF-8 text.") from exc
    return value


def _normalise_tags(tags: Sequence[str], where: str) -> list[str]:
    # A bare string would otherwise be read as a list of one-letter tags.
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise InvalidInputError(f"{where}: tags must be a list of strings, got {type(tags).__name__}.")
    if len(tags) > MAX_TAGS:
        raise InvalidInputError(f"{where}: at most {MAX_TAGS} tags per memory.")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidInputError(f"{where}: tags must be strings, got {type(tag).__name__}.")
        tag = _clean_text(tag, f"{where} tag").strip()
        if not tag or len(tag) > MAX_TAG_CHARS:
            raise InvalidInputError(f"{where}: tags must be 1-{MAX_TAG_CHARS} characters, got {tag[:20]!r}.")
        if tag not in out:
            out.append(tag)
    return out


def _check_int(value, name: str, low: int, high: int, error: type[InvalidInputError] = InvalidInputError) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{name} must be an integer from {low} to {high}, got {value!r}.")
    return value


def _check_number(value, name: str, low: float, high: float) -> float:
    # NaN fails the range test too.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidInputError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}.")
    return float(value)


def _check_session(session_id: str | None) -> str | None:
    if session_id is None:
        return None
    if not isinstance(session_id, str) or not session_id.strip() or len(session_id) > MAX_SESSION_CHARS:
        raise InvalidInputError(f"session_id must be a non-empty string of at most {MAX_SESSION_CHARS} characters.")
    return _clean_text(session_id, "session_id")


def _content_hash(text: str) -> str:
    canonical = " ".join(unicodedata.normalize("NFC", text).split())
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@typed_storage_errors
class MemoryEngine:
    """An open memory database with its embedder. Thread-safe; close() when done."""

    def __init__(self, config: TinyContextConfig | None = None, *, embedder: EmbedderProtocol | None = None, progress: bool = False):
        self.config = config or TinyContextConfig()
        self._embedder: EmbedderProtocol | None | object = _UNOPENED if embedder is None else embedder
        self._reindexed: int | None = None  # None until the embedder is bound to the database
        self._bind_lock = threading.Lock()
        self.keyword_reason: str | None = None
        self.tokens = TokenCounter(self.config.encoding_name)
        self.store = Store(self.config.memory_db_path, readers=self.config.read_connections)
        try:
            language.set_tokenizer(self.store, self.config.fts_tokenizer)
            # A new database gets a vector table at once, so counts and deletes never need the model.
            keyword.ensure_vector_table(self.store)
        except BaseException:  # do not leave the file open
            self.store.close()
            raise
        self.index = VectorIndex(self.store, self.config.vector_cache_max, self.config.vector_quantized_max)
        self.progress = progress
        self._mixed_sessions: set[str] = set()  # sessions whose id range holds other sessions' memories (_bm25)

    @property
    def embedder(self) -> EmbedderProtocol | None:
        """The embedding model (None: keyword-only), loaded and bound to the database on first use.

        Reading, deleting and listing never ask for it, so they work without loading the model and on
        a database built by another one; saving and recall then raise ``model_mismatch``."""
        if self._reindexed is None:
            with self._bind_lock:
                if self._reindexed is None:
                    if self._embedder is _UNOPENED:
                        # None: keyword-only (no model configured, or unavailable and keyword_fallback allows it).
                        self._embedder, self.keyword_reason = backends.open_embedder(self.config)
                    self._reindexed = keyword.bind(self.store, self.config, self._embedder)
        return self._embedder

    @property
    def reindexed(self) -> int:
        """How many memories binding the embedder (re-)embedded (reindex='auto')."""
        _ = self.embedder
        return self._reindexed

    @property
    def search_mode(self) -> str:
        """"hybrid" (BM25 + vectors) or "keyword" (BM25 only: no embedding model). Before the model is
        first needed this is the configured mode, without loading it."""
        if self._reindexed is None:
            return "keyword" if self.config.embedding_backend == NO_MODEL else "hybrid"
        return "keyword" if self._embedder is None else "hybrid"

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "MemoryEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- saving -------------------------------------------------------------------------------

    def _validate(self, memories: Iterable[MemoryInput | dict | str]) -> list[MemoryInput]:
        if isinstance(memories, (str, dict, MemoryInput)):
            memories = [memories]
        try:
            items = list(memories)
        except TypeError as exc:
            raise InvalidInputError("memories must be a list of {content, tags?, metadata?} objects.") from exc
        if not items:
            raise EmptyMemoryError("Nothing to save: pass at least one memory with non-empty content.")
        if len(items) > self.config.max_batch_size:
            raise InvalidInputError(f"At most {self.config.max_batch_size} memories per call ({len(items)} given); split the batch.")
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
            content = _clean_text(item.content, f"{where}.content").strip()
            if _BLANK.fullmatch(content):
                raise EmptyMemoryError(f"{where} has empty content; give every memory some text.", index=i)
            if len(content) > self.config.max_content_chars:
                raise InvalidInputError(f"{where}.content has {len(content)} characters; the limit is {self.config.max_content_chars}. Split it or save a summary.", index=i)
            # Depth first: json.dumps of very deep nesting raises RecursionError.
            too_deep = _depth(item.metadata) > MAX_METADATA_DEPTH
            try:
                meta_json = "" if too_deep else json.dumps(item.metadata, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(f"{where}.metadata must be plain JSON: {exc}", index=i) from exc
            _clean_text(meta_json, f"{where}.metadata")
            if too_deep or len(meta_json.encode("utf-8")) > MAX_METADATA_BYTES:
                raise InvalidInputError(f"{where}.metadata is too large (max {MAX_METADATA_BYTES} bytes, depth {MAX_METADATA_DEPTH}).", index=i)
            out.append(MemoryInput(
                content=content, tags=_normalise_tags(item.tags, where), metadata=item.metadata,
                occurred_at=parse_occurred_at(item.occurred_at, where),
                speaker=conversation.check_label(item.speaker, "speaker", conversation.MAX_SPEAKER_CHARS, where),
                attachments=conversation.check_attachments(item.attachments, where),
                episode=conversation.check_label(item.episode, "episode", conversation.MAX_EPISODE_CHARS, where),
                expires_at=expiry(item.expires_at, item.ttl_seconds, where),
                supersedes=None if item.supersedes is None else _check_int(item.supersedes, f"{where}.supersedes", 1, 2**63 - 1),
                valid_from=None if item.valid_from is None else parse_time(item.valid_from, f"{where}.valid_from"),
            ))
        return out

    def save(self, memories, *, session_id: str | None = None, episode: str | None = None) -> dict:
        """Save memories into a session. ``episode`` names the episode of those that name none;
        without it, one call's memories form a new episode as ``auto_episode`` says."""
        items = self._validate(memories)
        session = _check_session(session_id) or DEFAULT_SESSION
        call_episode = conversation.check_label(episode, "episode", conversation.MAX_EPISODE_CHARS, "save")
        return self._write(items, session, call_episode)

    def import_memories(self, memories: Sequence[StoredMemory | dict], *, session_id: str | None = None) -> dict:
        """Write exported memories into a session through the same path as :meth:`save` (same
        validation, exact duplicates skipped), keeping what an export carries: ``uid`` (a memory whose
        uid is already here is skipped, so importing twice adds nothing), the id when this database
        never used it (else a new one, reported in ``renumbered``), dates, version, history, and the
        vector when its size fits this embedder (else the text is embedded again)."""
        items, stored = self.check_import(memories)
        return self._write(items, _check_session(session_id) or DEFAULT_SESSION, None, stored)

    def check_import(self, memories: Sequence[StoredMemory | dict]) -> tuple[list[MemoryInput], list[StoredMemory]]:
        """What :meth:`import_memories` checks before writing, without writing: an importer checks a
        whole file first, so that a bad record refuses all of it."""
        try:
            stored = [m if isinstance(m, StoredMemory) else StoredMemory.model_validate(m) for m in memories]
        except ValidationError as exc:
            raise InvalidInputError(f"memories are malformed: {exc}".splitlines()[0]) from exc
        fields = set(MemoryInput.model_fields)
        items = self._validate([MemoryInput(**m.model_dump(include=fields)) for m in stored])
        for i, m in enumerate(stored):
            for old in m.history:
                if not {"version", "content", "created_at", "superseded_at"} <= old.keys():
                    raise InvalidInputError(f"memories[{i}].history entries need version, content, created_at and superseded_at.", index=i)
        return items, stored

    def renumber_links(self, ids: Sequence[int], renumbered: dict[int, int]) -> None:
        """After an import gave some memories new ids: point the imported memories' ``superseded_by``
        at their successors' new ids (joins the import's transaction)."""
        with self.store.write() as conn:
            conn.executemany("UPDATE memories SET superseded_by = ? WHERE superseded_by = ? AND id IN (SELECT value FROM json_each(?))",
                             [(new, old, json.dumps(list(ids))) for old, new in renumbered.items()])

    def ensure_session(self, session_id: str, *, created_at: str | None = None) -> bool:
        """Create a session (with ``created_at``, e.g. kept by an import) unless it exists; True if created."""
        session = _check_session(session_id)
        if session is None:
            raise InvalidInputError("session_id must be a non-empty string.")
        if created_at is not None and not isinstance(created_at, str):
            raise InvalidInputError("created_at must be an ISO 8601 string.")
        with self.store.write() as conn:
            return conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (session, created_at or now_iso())).rowcount > 0

    def _write(self, items: list[MemoryInput], session: str, call_episode: str | None,
               stored: list[StoredMemory] | None = None) -> dict:
        """Insert validated memories (one transaction); ``stored``: imports, parallel to ``items``."""
        indexed = [conversation.embedding_text(m.content, m.speaker, m.occurred_at, m.attachments) for m in items]
        # The same words said by another speaker or on another day are another memory.
        hashes = [_content_hash(text) for text in indexed]
        tokens = self.tokens.count_many([conversation.display_text(m.content, m.speaker, m.attachments) for m in items])
        # Keyword-only: no vectors, so no near-duplicate check (exact duplicates are still skipped).
        vectors, missing = (None, []) if self.embedder is None else self._vectors(items, indexed, stored)
        renumbered: dict[int, int] = {}
        saved: list[dict] = []
        skipped: list[dict] = []
        near: list[dict] = []
        check = vectors is not None and self.config.dedup_mode != "off"
        if check:
            self.index.prepare(session)
        with self.index.write() as conn:
            # All stored neighbours in one matrix product (None: session too big for the copy, ask vec0).
            neighbours = self.index.nearest(session, vectors) if check else [None] * len(items)
            created = now_iso()
            batch_seen: dict[str, int] = {}
            batch_kept: list[tuple[int, np.ndarray]] = []
            episodes: dict[str, int] = {}
            auto_key = f"save-{uuid.uuid4().hex[:16]}"
            ceiling = conn.execute("SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'memories'").fetchone()[0]
            # What is already here, for the whole call in two look-ups: uids (imports) and this session's texts.
            uids = [m.uid for m in stored or () if m.uid is not None]
            present = dict(conn.execute("SELECT uid, id FROM memories WHERE uid IN (SELECT value FROM json_each(?))",
                                        (json.dumps(uids),)).fetchall()) if uids else {}
            existing = dict(conn.execute("SELECT content_hash, min(id) FROM memories WHERE session_id = ? AND content_hash IN "
                                         "(SELECT value FROM json_each(?)) GROUP BY content_hash", (session, json.dumps(hashes))).fetchall())
            self._check_supersedes(conn, [m.supersedes for m in items])
            texts: dict[int, str] = {}  # this call's memories, for the supersession check against each other
            rows, tag_rows, history_rows, candidates, supersede = [], [], [], [], []
            for i, (item, digest, vector) in enumerate(zip(items, hashes, [None] * len(items) if vectors is None else vectors)):
                restored = stored[i] if stored is not None else None
                if restored is not None and restored.uid is not None and restored.uid in present:
                    skipped.append({"index": i, "reason": "already_imported", "duplicate_of": present[restored.uid]})
                    continue
                if digest in existing or digest in batch_seen:
                    # Same text already in this session: saving it again would only waste recall tokens.
                    same = existing.get(digest, batch_seen.get(digest))
                    skipped.append({"index": i, "reason": "duplicate", "duplicate_of": same})
                    if item.supersedes is not None and item.supersedes != same:
                        # The new fact is already stored (e.g. saved before its supersession candidate was
                        # reported): that memory is the one that supersedes.
                        supersede.append((item.valid_from or created, same, item.supersedes))
                        skipped[-1]["supersedes"] = item.supersedes
                    continue
                similar = None
                if check and restored is None:
                    similar = _nearest(neighbours[i] if neighbours is not None else self._vec0_nearest(conn, session, vector), vector, batch_kept)
                if similar and similar[0] == item.supersedes:
                    similar = None  # the memory it replaces is expected to be close
                changed = None
                if similar and similar[1] >= self.config.supersession_threshold:
                    old = texts.get(similar[0]) or conn.execute("SELECT content FROM memories WHERE id = ? AND valid_until IS NULL",
                                                                (similar[0],)).fetchone()
                    changed = old and facts.contradiction(item.content, old if isinstance(old, str) else old[0])
                if changed:
                    # Same subject, other value: the caller decides (save again with supersedes); never skipped as a near-duplicate.
                    candidates.append({"index": i, "supersedes": similar[0], "similarity": round(similar[1], 4), **changed})
                elif similar and similar[1] >= self.config.dedup_threshold:
                    report = {"index": i, "similar_to": similar[0], "similarity": round(similar[1], 4)}
                    if self.config.dedup_mode == "skip":
                        skipped.append({**report, "reason": "near_duplicate"})
                        continue
                    near.append(report)
                if not rows:  # the session is created with its first memory: a call that only skips adds nothing
                    conn.execute("INSERT OR IGNORE INTO sessions(id, created_at) VALUES (?, ?)", (session, created))
                key = item.episode if restored is not None else item.episode or call_episode or self._auto_episode(item, auto_key)
                if key is not None and key not in episodes:
                    conn.execute("INSERT OR IGNORE INTO episodes(session_id, key, created_at) VALUES (?, ?, ?)", (session, key, created))
                    episodes[key] = conn.execute("SELECT id FROM episodes WHERE session_id = ? AND key = ?", (session, key)).fetchone()[0]
                # An id is kept only above every id this database ever used: an agent may still act on a deleted one.
                # Otherwise the next id, as AUTOINCREMENT would give it (the write lock is held).
                mid = restored.id if restored is not None and restored.id is not None and restored.id > ceiling else ceiling + 1
                ceiling = mid
                born = (restored.created_at if restored is not None else None) or created
                valid_from = item.valid_from or (created if item.supersedes is not None else None)
                if item.supersedes is not None:
                    supersede.append((valid_from, mid, item.supersedes))
                rows.append((mid, session, item.content, json.dumps(item.tags, ensure_ascii=False), json.dumps(item.metadata, ensure_ascii=False),
                             digest, tokens[i], born, (restored.updated_at if restored is not None else None) or born,
                             restored.version if restored is not None else 1, item.occurred_at, item.speaker,
                             json.dumps(item.attachments, ensure_ascii=False),
                             conversation.search_context(item.speaker, item.occurred_at, item.attachments),
                             None if key is None else episodes[key], item.expires_at,
                             (restored.uid if restored is not None else None) or uuid.uuid4().hex, valid_from,
                             restored.valid_until if restored is not None else None,
                             restored.superseded_by if restored is not None else None))
                if restored is not None:
                    if restored.uid is not None:
                        present[restored.uid] = mid  # the same uid twice in one call: the second is skipped
                    if restored.id is not None and restored.id != mid:
                        renumbered[restored.id] = mid
                    history_rows += [(mid, int(h["version"]), str(h["content"]), json.dumps(h.get("tags") or [], ensure_ascii=False),
                                      json.dumps(h.get("metadata") or {}, ensure_ascii=False), str(h["created_at"]), str(h["superseded_at"]))
                                     for h in restored.history]
                tag_rows += [(mid, t) for t in item.tags]
                if vector is not None:
                    batch_kept.append((mid, vector))
                batch_seen[digest] = mid
                texts[mid] = item.content
                saved.append({"index": i, "id": mid, "tokens": tokens[i], **({"supersedes": item.supersedes} if item.supersedes else {})})
            conn.executemany(
                "INSERT INTO memories(id, session_id, content, tags, metadata, content_hash, tokens, created_at, updated_at, version,"
                " occurred_at, speaker, attachments, context, episode_id, expires_at, uid, valid_from, valid_until, superseded_by)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            # The old fact keeps its text and history; it now ends where the new one starts.
            conn.executemany("UPDATE memories SET valid_until = ?, superseded_by = ? WHERE id = ?", supersede)
            conn.executemany("INSERT OR REPLACE INTO memory_versions(memory_id, version, content, tags, metadata, created_at, superseded_at)"
                             " VALUES (?, ?, ?, ?, ?, ?, ?)", history_rows)
            conn.executemany("INSERT OR IGNORE INTO memory_tags(memory_id, tag) VALUES (?, ?)", tag_rows)
            if batch_kept:
                kept_ids, kept_vectors = [mid for mid, _ in batch_kept], np.stack([v for _, v in batch_kept])
                insert_vectors(conn, kept_ids, session, kept_vectors)
                self.index.add(session, kept_ids, kept_vectors)
            conversation.index_episodes(conn, episodes.values())
        return {
            "session_id": session,
            "ids": [s["id"] for s in saved],
            "saved": saved,
            "skipped": skipped,
            "near_duplicates": near,
            # Stored facts these look like changed versions of: not applied, save with supersedes to do so.
            **({"supersession_candidates": candidates} if candidates else {}),
            "total_tokens": sum(s["tokens"] for s in saved),
            **({"renumbered": renumbered, "embedded": len({s["index"] for s in saved} & set(missing))} if stored is not None else {}),
        }

    @staticmethod
    def _check_supersedes(conn, targets: list[int | None]) -> None:
        """The ids a save replaces: each must exist, be current, and be named once (read under the write lock)."""
        wanted = [t for t in targets if t is not None]
        if len(set(wanted)) != len(wanted):
            raise InvalidInputError("Two memories in one call supersede the same memory; one memory replaces it.")
        if not wanted:
            return
        found = {r[0]: r[1] for r in conn.execute("SELECT id, superseded_by FROM memories WHERE id IN (SELECT value FROM json_each(?))",
                                                   (json.dumps(wanted),))}
        for target in wanted:
            if target not in found:
                raise MemoryNotFoundError(f"supersedes: no memory with id {target}; nothing was saved. Recall to find current ids.")
            if found[target] is not None:
                raise ConflictError(f"supersedes: memory {target} was already superseded by {found[target]}; supersede that one instead. "
                                    "Nothing was saved.", id=target, superseded_by=found[target])

    def _vectors(self, items: list, indexed: list[str], stored) -> tuple[np.ndarray, list[int]]:
        """One vector per item: a valid stored one (import) or freshly embedded; and which were embedded."""
        dims = self.embedder.identity["dimensions"]
        given = [None if stored is None else _stored_vector(stored[i].vector, dims) for i in range(len(items))]
        missing = [i for i, v in enumerate(given) if v is None]
        computed = iter(self.embedder.embed_documents([indexed[i] for i in missing], progress=self.progress)) if missing else iter(())
        return (np.stack([v if v is not None else next(computed) for v in given]) if items else np.zeros((0, dims), np.float32)), missing

    def _auto_episode(self, item: MemoryInput, key: str) -> str | None:
        mode = self.config.auto_episode
        return key if mode == "all" or (mode == "turns" and item.speaker) else None

    @staticmethod
    def _vec0_nearest(conn, session: str, vector: np.ndarray) -> tuple[int, float] | None:
        """The session's most similar stored memory by sqlite-vec (sessions too big for the copy)."""
        row = conn.execute(
            "SELECT memory_id, distance FROM memory_vectors WHERE embedding MATCH ? AND k = 1 AND session_id = ?",
            (vector.tobytes(), session),
        ).fetchone()
        return (row[0], 1.0 - row[1]) if row else None

    # -- recall -------------------------------------------------------------------------------

    def recall(self, query: str, *, session_id: str | None = None, max_tokens: int | None = None, top_k: int | None = None,
               tags: Sequence[str] | None = None, offset: int = 0, dense_weight: float | None = None,
               rrf_k: float | None = None, candidates: int | None = None, filters: Filters | dict | None = None,
               episode_weight: float | None = None, neighbour_weight: float | None = None, speaker_boost: float | None = None,
               min_dense: float | None = None, score_cliff: float | None = None, time_boost: float | None = None,
               signals: Signals | None = None, ranking: int = 0, fusion: str | None = None) -> dict:
        """The library answer: full memory dicts whose content fits ``max_tokens``. Interfaces that
        hand text to an agent use :meth:`recall_rendered`, whose budget covers what they render.
        ``filters`` (see :mod:`tinycontext.retrieval.filters`) narrows by tags, metadata and time.
        ``signals``: this query's :meth:`search`, fused instead of searching again. ``ranking``: also
        return the first ``ranking`` positions of the order the answer was chosen from (ids, ranks,
        scores; no budget), e.g. to score the ranking and the budgeted answer from one recall."""
        started = time.perf_counter()
        max_tokens = self.config.recall_max_tokens if max_tokens is None else max_tokens
        _check_int(max_tokens, "max_tokens", 1, 1_000_000, RecallBudgetError)
        _check_int(ranking, "ranking", 0, 10_000)
        ranked = self._rank(query, session_id=session_id, top_k=top_k, tags=tags, offset=offset,
                            dense_weight=dense_weight, rrf_k=rrf_k, candidates=candidates, filters=filters,
                            episode_weight=episode_weight, neighbour_weight=neighbour_weight, speaker_boost=speaker_boost,
                            min_dense=min_dense, score_cliff=score_cliff, time_boost=time_boost, signals=signals, fusion=fusion)
        window = ranked["window"]
        chosen, skipped, stop = fit_budget((m["tokens"] for m in window), max_tokens, ranked["top_k"])
        memories = [window[p] for p in chosen]
        omitted = [{"id": window[p]["id"], "rank": window[p]["rank"], "tokens": window[p]["tokens"]} for p in skipped]
        return {
            "query": ranked["query"],
            "session_id": ranked["session_id"],
            "memories": memories,
            "total_tokens": sum(m["tokens"] for m in memories),
            "max_tokens": max_tokens,
            # The budget (not top_k) left something out: skipped inside the page, or the page ended early.
            "truncated": bool(omitted) or (stop is not None and len(chosen) < ranked["top_k"]),
            "omitted": omitted,
            "next_offset": None if stop is None else offset + stop,
            "candidates": ranked["candidates"],
            # Candidates the relevance floor (recall_min_dense) left out: no lexical match, weak dense similarity.
            "below_floor": ranked["below_floor"],
            # Candidates after the score cliff (recall_score_cliff): clearly weaker than what was returned.
            "below_cliff": ranked["below_cliff"],
            "mode": self.search_mode,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
            **({"ranking": [{"id": m["id"], "rank": m["rank"], "scores": m["scores"]} for m in window[:ranking]]} if ranking else {}),
        }

    def recall_rendered(self, query: str, *, session_id: str | None = None, max_tokens: int | None = None,
                        top_k: int | None = None, tags: Sequence[str] | None = None, offset: int = 0,
                        detail: str = "compact", filters: Filters | dict | None = None, **ranking: float | None) -> Page:
        """Recall as an agent receives it: text and structured content, each within ``max_tokens``
        counted with the configured encoding (see :mod:`tinycontext.budget.render`). ``ranking``: the
        ranking settings :meth:`recall` takes (``dense_weight``, ``rrf_k``, ``candidates``, ``signals``, ...)."""
        detail = check_detail(detail)
        max_tokens = check_agent_budget(self.config.recall_max_tokens if max_tokens is None else max_tokens)
        ranked = self._rank(query, session_id=session_id, top_k=top_k, tags=tags, offset=offset, filters=filters, **ranking)
        return recall_page(ranked["window"], max_tokens=max_tokens, counter=self.tokens, limit=ranked["top_k"],
                           offset=offset, detail=detail, session_id=ranked["session_id"],
                           extra={**({"below_floor": ranked["below_floor"]} if ranked["below_floor"] else {}),
                                  **({"below_cliff": ranked["below_cliff"]} if ranked["below_cliff"] else {}),
                                  **({"mode": "keyword"} if self.embedder is None else {})} or None)

    def default_min_dense(self) -> float:
        """The relevance floor: ``recall_min_dense`` when set, else the floor the embedding model states
        (a bundle's ``model_config.json`` ``min_dense``, ``embedding_min_dense`` for a server), else the
        default (0.3, tuned for all-MiniLM-L6-v2: other models' cosines live on other scales)."""
        stated = getattr(self.embedder, "min_dense", None)
        if "recall_min_dense" in self.config.model_fields_set or stated is None:
            return self.config.recall_min_dense
        return float(stated)

    def _rank(self, query: str, *, session_id: str | None, top_k: int | None, tags: Sequence[str] | None, offset: int,
              dense_weight: float | None = None, rrf_k: float | None = None, candidates: int | None = None,
              filters: Filters | dict | None = None, episode_weight: float | None = None,
              neighbour_weight: float | None = None, speaker_boost: float | None = None, min_dense: float | None = None,
              score_cliff: float | None = None, time_boost: float | None = None, signals: Signals | None = None,
              fusion: str | None = None) -> dict:
        """Ranked memories from ``offset`` on (full dicts with rank and scores), before any budget."""
        query = self._check_query(query)
        top_k = self.config.recall_top_k if top_k is None else top_k
        _check_int(top_k, "top_k", 1, 1000)
        _check_int(offset, "offset", 0, MAX_OFFSET)
        weight = _check_number(self.config.recall_dense_weight if dense_weight is None else dense_weight, "dense_weight", 0.0, 1.0)
        if self.embedder is None:
            weight = 0.0  # keyword-only: BM25 alone
        k = _check_number(self.config.recall_rrf_k if rrf_k is None else rrf_k, "rrf_k", 0.0, 1e6)
        episode_weight = _check_number(self.config.recall_episode_weight if episode_weight is None else episode_weight, "episode_weight", 0.0, 10.0)
        neighbour_weight = _check_number(self.config.recall_neighbour_weight if neighbour_weight is None else neighbour_weight, "neighbour_weight", 0.0, 1.0)
        speaker_boost = _check_number(self.config.recall_speaker_boost if speaker_boost is None else speaker_boost, "speaker_boost", 0.0, 10.0)
        min_dense = _check_number(self.default_min_dense() if min_dense is None else min_dense, "min_dense", 0.0, 1.0)
        cliff = _check_number(self.config.recall_score_cliff if score_cliff is None else score_cliff, "score_cliff", 0.0, 0.99)
        time_boost = _check_number(self.config.recall_time_boost if time_boost is None else time_boost, "time_boost", 0.0, 10.0)
        fusion = self.config.recall_fusion if fusion is None else fusion
        if fusion not in ("learned", "rrf"):
            raise InvalidInputError(f"fusion must be 'learned' or 'rrf', got {fusion!r}.")
        # Resolved once per recall (dateparser only runs when the query has a date phrase).
        windows = when.question_windows(query, datetime.now()) if time_boost else []
        depth, session, tag_list, filters = self._search_scope(session_id, tags, filters, candidates)
        # A list with zero weight is not searched (and not used when given).
        keyword_wanted, dense_wanted = weight < 1.0, weight > 0.0
        if signals is None:
            first = self._search(query, session, tag_list, filters, depth, keyword=keyword_wanted, dense=dense_wanted)
        elif ((signals.query, signals.session_id, signals.tags, signals.filters, signals.depth) != (query, session, tuple(tag_list), filters, depth)
              or (keyword_wanted and signals.bm25 is None) or (dense_wanted and signals.dense is None)):
            raise InvalidInputError("signals were searched for another query, session, tags, filters or candidates, "
                                    "or lack a list this weighting needs: search again with this recall's settings.")
        else:
            first = signals

        def ordered(depth: int) -> tuple[list, int]:
            # Deeper pages search again (the query's vector is cached by then).
            found = first if depth == first.depth else self._search(query, session, tag_list, filters, depth,
                                                                    keyword=keyword_wanted, dense=dense_wanted)
            bm25_hits = list(found.bm25) if keyword_wanted else []
            dense_hits = list(found.dense) if dense_wanted else []
            ranked = fuse(bm25_hits, dense_hits, dense_weight=weight, k=k)
            # The relevance floor: its own step, so re-rankers before or after it compose.
            ranked, below_floor = relevance_floor(ranked, min_dense)
            if ranked and (fusion == "learned" or episode_weight or neighbour_weight or speaker_boost):
                # A neighbour outside the candidates may join only when nothing filtered them.
                ranked = self._conversation_rerank(query, session, ranked, dense_hits, episode_weight, neighbour_weight, speaker_boost,
                                                   expand=not tag_list and not filters, fusion=fusion)
            if ranked and windows:
                ranked = when.boost(ranked, self._times([c.id for c in ranked]), windows, time_boost)
            return ranked, below_floor

        ranked, below_floor = ordered(depth)
        if offset + top_k > depth:
            # Deep pages: a deeper search reorders what a shallower one ranked, so page N+1 could repeat
            # or skip page N's memories. The order is fixed tier by tier instead: the first `depth`
            # positions come from the first search, each deeper search (twice as deep) only appends
            # memories not ranked yet. Every page reads the same order.
            ranked, seen = ranked[:depth], {c.id for c in ranked[:depth]}
            while offset + top_k > depth:
                shown, depth = depth, depth * 2
                fresh = [c for c in ordered(depth)[0] if c.id not in seen][:depth - shown]
                if not fresh:
                    break
                ranked += fresh
                seen.update(c.id for c in fresh)
        # The score cliff cuts the whole order, not the page, so every page agrees where the answer ends.
        # It reads two signals' agreement: one signal's decay alone (BM25-only, keyword-only, dense-only)
        # is no sign that the rest is not evidence, so a single-signal ranking keeps its full order.
        kept = cliff_cut([(c.bm25, c.dense) for c in ranked], cliff if 0.0 < weight < 1.0 else 0.0)
        ranked, below_cliff = ranked[:kept], len(ranked) - kept
        window = ranked[offset:]
        rows = self._rows([c.id for c in window])
        memories = [
            {**rows[c.id], "rank": offset + position + 1, "scores": {"rrf": c.rrf, "bm25": c.bm25, "dense": c.dense}}
            for position, c in enumerate(c for c in window if c.id in rows)
        ]
        return {"query": query, "session_id": session, "top_k": top_k, "window": memories, "candidates": len(ranked),
                "below_floor": below_floor, "below_cliff": below_cliff}

    def search(self, query: str, *, session_id: str | None = None, tags: Sequence[str] | None = None,
               filters: Filters | dict | None = None, candidates: int | None = None) -> Signals:
        """The candidate lists a recall with these settings fuses: BM25 and (with a model) dense hits,
        each ``candidates`` deep. :meth:`recall` is this search, then fusion, re-ranking, the score
        cliff and the budget; ``recall(..., signals=...)`` runs only the latter on a search done once."""
        query = self._check_query(query)
        depth, session, tag_list, filters = self._search_scope(session_id, tags, filters, candidates)
        return self._search(query, session, tag_list, filters, depth, keyword=True, dense=self.embedder is not None)

    @staticmethod
    def _check_query(query) -> str:
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be non-empty text: say what you want to remember.")
        return _clean_text(query, "query")

    def _search_scope(self, session_id, tags, filters, candidates) -> tuple[int, str | None, list[str], Filters]:
        """Validated (depth, session, tags, filters) of a search; expired memories purged first."""
        depth = _check_int(self.config.recall_candidates if candidates is None else candidates, "candidates", 1, 10_000)
        session = _check_session(session_id)
        tag_list = _normalise_tags([] if tags is None else tags, "tags")
        filters = parse_filters(filters)
        browse.purge_expired(self)
        if session is not None and not self.store.read("SELECT 1 FROM sessions WHERE id = ?", (session,)):
            raise SessionNotFoundError(f"No session {session!r}. Save memories into it first, or recall without session_id to search all sessions.")
        return depth, session, tag_list, filters

    def _search(self, query: str, session: str | None, tag_list: list[str], filters: Filters, depth: int, *,
                keyword: bool, dense: bool) -> Signals:
        # The dense search (query embedding, then the vector scan) runs on a worker thread while FTS5 runs
        # here: ONNX, numpy and SQLite release the GIL, so on two cores the steps overlap instead of adding up.
        pending = _QUERY_POOL.submit(self._dense, query, session, tag_list, depth, filters) if dense else None
        bm25 = tuple(self._bm25(query, session, tag_list, depth, filters)) if keyword else None
        return Signals(query, session, tuple(tag_list), filters, depth, bm25, tuple(pending.result()) if pending else None)

    def _conversation_rerank(self, query: str, session: str | None, ranked: list, dense_hits: list, episode_weight: float,
                             neighbour_weight: float, speaker_boost: float, *, expand: bool, fusion: str) -> list:
        def turns(ids) -> dict[int, tuple]:
            return {r[0]: (r[1], r[2]) for r in self.store.read(
                "SELECT id, episode_id, speaker FROM memories WHERE id IN (SELECT value FROM json_each(?)) "
                "AND (episode_id IS NOT NULL OR speaker IS NOT NULL)", (json.dumps(ids),))}

        candidates = [c.id for c in ranked]
        # The candidates first: without conversation turns among them there is nothing to re-score,
        # and their neighbours need not be read.
        info = turns(candidates)
        if not info:
            return ranked
        learned = fusion == "learned" and bool(dense_hits)
        if learned:
            # The features read the turns two either side of a candidate (a joining neighbour's own
            # neighbour) and the dense hits' episodes.
            near = {i + step for i in candidates for step in (-2, -1, 1, 2)} | {i for i, _ in dense_hits}
            info.update(turns(sorted(near.difference(candidates))))
        elif neighbour_weight and expand:
            info.update(turns(sorted({i + step for i in candidates for step in (-1, 1)}.difference(candidates))))
        has_episodes = any(turn[0] is not None for turn in info.values())
        wants_episodes = has_episodes and (learned or episode_weight)
        episode_hits = conversation.episode_bm25(self.store, query, session, self.config.fts_tokenizer) if wants_episodes else []
        if learned:
            return conversation.learned_rerank(ranked, info, query=query, episode_hits=episode_hits, dense_hits=dense_hits, expand=expand)
        return conversation.rerank(ranked, info, query=query, episode_hits=episode_hits, dense_hits=dense_hits,
                                   episode_weight=episode_weight if has_episodes else 0.0,
                                   neighbour_weight=neighbour_weight if has_episodes else 0.0, speaker_boost=speaker_boost,
                                   expand=expand)

    def _times(self, ids: list[int]) -> dict[int, str]:
        """When each memory happened: ``occurred_at``, else when it was saved."""
        return {r[0]: r[1] for r in self.store.read(
            "SELECT id, coalesce(occurred_at, created_at) FROM memories WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),))}

    @staticmethod
    def _filter_sql(tags: Sequence[str], filters: Filters | None, id_column: str) -> tuple[str, list]:
        """`` AND condition`` (or "") and its parameters: ``tags`` is the any-of shorthand, and
        both it and ``filters`` must hold."""
        sql, params = "", []
        for part in (Filters(tags_any=tuple(tags)), filters or Filters()):
            condition, values = part.sql(id_column)
            if condition:
                sql += " AND " + condition
                params += values
        return sql, params

    def _bm25(self, query: str, session: str | None, tags: Sequence[str], depth: int, filters: Filters | None = None) -> list[tuple[int, float]]:
        span = None
        if session is not None and self.store.read("SELECT min(id) = max(id) AND min(id) = ? FROM sessions", (session,))[0][0]:
            session = None  # the only session: filtering by it changes nothing, and the join costs ~25%
        elif session is not None:
            # FTS5 scores every match before a join could drop other sessions' rows; limited to the
            # session's id range it skips the rows outside it.
            span = self.store.session_span(session)
            if span is None:
                return []
        # The trigram index takes substrings, and terms under 3 characters only through LIKE (language.py).
        if self.config.fts_tokenizer == "trigram":
            match, short = language.trigram_query(query)
        else:
            match, short = bounded_match(self.store, query, self.config.recall_fts_budget, span), []
        if match is None and not short:
            return []
        if session is not None and session not in self._mixed_sessions:
            # A session's id range usually holds only its own memories, and then the join is not needed.
            # Exact either way: a hit from another session sends the search through the join, and the
            # session is remembered as mixed (ids only grow, so it stays so).
            hits = self._bm25_hits(match, short, None, span, tags, filters, depth)
            if not hits or not self.store.read("SELECT 1 FROM memories WHERE id IN (SELECT value FROM json_each(?)) AND session_id != ? LIMIT 1",
                                               (json.dumps([h[0] for h in hits]), session)):
                return hits
            self._mixed_sessions.add(session)
        return self._bm25_hits(match, short, session, span, tags, filters, depth)

    def _bm25_hits(self, match: str | None, short: list[str], session: str | None, span: tuple[int, int] | None,
                   tags: Sequence[str], filters: Filters | None, depth: int) -> list[tuple[int, float]]:
        if session is None:
            # Every FTS row is a memory (triggers), so no join is needed to read ids.
            base, params, id_column = "FROM memories_fts WHERE {where}", [], "rowid"
        else:
            # CROSS JOIN keeps FTS5 the outer loop: driven by the session index, SQLite would run the MATCH once per row.
            base, params, id_column = ("FROM memories_fts CROSS JOIN memories m ON m.id = memories_fts.rowid WHERE {where} "
                                       "AND m.session_id = ?"), [session], "m.id"
        if span is not None:
            base, params = base + " AND memories_fts.rowid BETWEEN ? AND ?", [*params, *span]
        # The filter is part of the FTS query, so the LIMIT keeps the best matches that pass it. The unary
        # "+" keeps SQLite from driving FTS5 by the filter's id list: it would run the MATCH once per id
        # (minutes for a filter passing half of 50k memories) instead of once, checking each hit's id.
        filter_sql, filter_params = self._filter_sql(tags, filters, "+" + id_column)
        hits: list[tuple[int, float]] = []
        if match is not None:
            sql = (f"SELECT {id_column}, -bm25(memories_fts, 1.0, 0.5, 1.0) AS score " + base.format(where="memories_fts MATCH ?")
                   + filter_sql + f" ORDER BY score DESC, {id_column} LIMIT ?")
            hits = [(r[0], r[1]) for r in self.store.read(sql, [match, *params, *filter_params, depth])]
        if short and len(hits) < depth:
            # Short terms rank after the BM25 hits, by how many of them a memory contains.
            likes = ["(memories_fts.content LIKE ? ESCAPE '\\' OR memories_fts.tags LIKE ? ESCAPE '\\')" for _ in short]
            patterns = [p for term in short for p in (language.like_pattern(term),) * 2]
            seen = {h[0] for h in hits}
            sql = (f"SELECT {id_column}, {' + '.join(likes)} AS score " + base.format(where="(" + " OR ".join(likes) + ")")
                   + filter_sql + f" ORDER BY score DESC, {id_column} LIMIT ?")
            rows = self.store.read(sql, [*patterns, *patterns, *params, *filter_params, depth])
            hits += [(r[0], float(r[1])) for r in rows if r[0] not in seen][: depth - len(hits)]
        return hits

    def _dense(self, query: str, session: str | None, tags: Sequence[str], depth: int, filters: Filters | None = None, *,
               vector: np.ndarray | None = None) -> list[tuple[int, float]]:
        if vector is None:
            vector = self.embedder.embed_query(query)
        filter_sql, filter_params = self._filter_sql(tags, filters, "id")
        with self.store.lock:
            allowed = None
            if filter_sql:
                # The ids that pass, searched exhaustively: the top-k is taken among them only.
                allowed = np.array([r[0] for r in self.store.read("SELECT id FROM memories WHERE 1" + filter_sql, filter_params)], np.int64)
            hits = self.index.search(vector, session, min(depth, VEC_KNN_MAX), allowed)
        if hits is not None:
            return hits
        sql = "SELECT memory_id, distance FROM memory_vectors WHERE embedding MATCH ? AND k = ?"
        params: list = [vector.tobytes(), min(depth, VEC_KNN_MAX)]
        if session is not None:
            sql += " AND session_id = ?"
            params.append(session)
        if filter_sql:  # vec0 takes one "rowid IN (...)" per query
            sql += f" AND memory_id IN (SELECT id FROM memories WHERE 1{filter_sql})"
            params += filter_params
        rows = self.store.read(sql, params)
        # vec0 allows only ORDER BY distance; break ties by id here so results are deterministic.
        return [(r[0], 1.0 - r[1]) for r in sorted(rows, key=lambda r: (r[1], r[0]))]

    def _rows(self, ids: list[int]) -> dict[int, dict]:
        if not ids:
            return {}
        rows = self.store.read(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),))
        return {r[0]: row_to_memory(r) for r in rows}

    # -- single memories ----------------------------------------------------------------------

    def get(self, memory_id: int, *, history: bool = True) -> dict:
        memory_id = _check_id(memory_id)
        rows = self._rows([memory_id])
        if memory_id not in rows:
            raise MemoryNotFoundError(f"No memory with id {memory_id}; it may have been deleted. Recall to find current ids.")
        memory = rows[memory_id]
        if history:
            memory["history"] = [
                {"version": r[0], "content": r[1], "tags": json.loads(r[2]), "metadata": json.loads(r[3]),
                 "created_at": r[4], "superseded_at": r[5]}
                for r in self.store.read(
                    "SELECT version, content, tags, metadata, created_at, superseded_at FROM memory_versions "
                    "WHERE memory_id = ? ORDER BY version", (memory_id,))
            ]
        return memory

    def update(self, memory_id: int, content: str | None = None, *, tags: Sequence[str] | None = None,
               metadata: dict | None = None, expected_version: int | None = None) -> dict:
        """Replace a memory's content/tags/metadata; the old version stays readable in its history.

        Omitted fields keep their current value, read under the write lock, so a concurrent edit is
        never reverted. ``expected_version``: refuse with ``conflict`` (changing nothing) unless the
        memory is still at that version."""
        memory_id = _check_id(memory_id)
        if expected_version is not None:
            _check_int(expected_version, "expected_version", 1, 2**62)
        # Validate and embed what was given before taking the lock (embedding is the slow part). Who
        # said it, when, and what was shared never change on update, so reading them here is safe.
        given = self._validate([{"content": "-" if content is None else content, "tags": [] if tags is None else tags,
                                 "metadata": {} if metadata is None else metadata}])[0]
        current = self.get(memory_id, history=False)
        facts = (current["speaker"], current["occurred_at"], current["attachments"])
        vector = self.embedder.embed_documents([conversation.embedding_text(given.content, *facts)])[0] \
            if content is not None and self.embedder is not None else None
        with self.index.write() as conn:
            row = conn.execute("SELECT version, content, tags, metadata, updated_at, created_at, session_id FROM memories WHERE id = ?",
                               (memory_id,)).fetchone()
            if row is None:
                raise MemoryNotFoundError(f"No memory with id {memory_id}; it may have been deleted. Recall to find current ids.")
            if expected_version is not None and row[0] != expected_version:
                raise ConflictError(f"Memory {memory_id} is at version {row[0]}, not {expected_version}: it changed since you read it. "
                                    "Get it again and re-apply your edit.", id=memory_id, version=row[0])
            new_content = row[1] if content is None else given.content
            new_tags = json.loads(row[2]) if tags is None else given.tags
            new_metadata = json.loads(row[3]) if metadata is None else given.metadata
            stamp = now_iso()
            conn.execute(
                "INSERT INTO memory_versions(memory_id, version, content, tags, metadata, created_at, superseded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (memory_id, row[0], row[1], row[2], row[3], row[4] or row[5], stamp),
            )
            conn.execute(
                "UPDATE memories SET content = ?, tags = ?, metadata = ?, content_hash = ?, tokens = ?, updated_at = ?, version = ? WHERE id = ?",
                (new_content, json.dumps(new_tags, ensure_ascii=False), json.dumps(new_metadata, ensure_ascii=False),
                 _content_hash(conversation.embedding_text(new_content, *facts)),
                 self.tokens.count(conversation.display_text(new_content, facts[0], facts[2])), stamp, row[0] + 1, memory_id),
            )
            conversation.index_episodes(conn, [e for (e,) in conn.execute("SELECT episode_id FROM memories WHERE id = ? AND episode_id IS NOT NULL", (memory_id,))])
            conn.execute("DELETE FROM memory_tags WHERE memory_id = ?", (memory_id,))
            conn.executemany("INSERT INTO memory_tags(memory_id, tag) VALUES (?, ?)", [(memory_id, t) for t in new_tags])
            if vector is not None and new_content != row[1]:
                conn.execute("UPDATE memory_vectors SET embedding = ? WHERE memory_id = ?", (vector.tobytes(), memory_id))
                codes.put(conn, [memory_id], row[6], vector[None, :])
                self.index.replace(row[6], memory_id, vector)
            elif self.embedder is None and new_content != row[1]:
                # Keyword-only: the old vector no longer matches; reindex embeds the new text.
                conn.execute("DELETE FROM memory_vectors WHERE memory_id = ?", (memory_id,))
                codes.drop(conn, row[6], [memory_id])
                self.index.remove(row[6], memory_id)
        return self.get(memory_id)

    def delete(self, memory_id: int) -> dict:
        memory_id = _check_id(memory_id)
        with self.index.write() as conn:
            row = conn.execute("SELECT session_id, episode_id FROM memories WHERE id = ?", (memory_id,)).fetchone()
            if row is None:
                raise MemoryNotFoundError(f"No memory with id {memory_id}; nothing was deleted.")
            conn.execute("DELETE FROM memory_vectors WHERE memory_id = ?", (memory_id,))
            self.index.remove(row[0], memory_id)
            conn.execute("DELETE FROM memory_tags WHERE memory_id = ?", (memory_id,))
            conn.execute("DELETE FROM memory_versions WHERE memory_id = ?", (memory_id,))
            conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
            if row[1] is not None:
                conversation.index_episodes(conn, [row[1]])
        return {"id": memory_id, "deleted": True}

    # -- browsing and housekeeping (tinycontext/memory/browse.py) -------------------------------------------

    def list_memories(self, **options) -> Page:
        """A budgeted page of memories; see :func:`tinycontext.memory.browse.list_memories`."""
        return browse.list_memories(self, **options)

    def list_sessions(self) -> dict:
        return browse.list_sessions(self)

    def delete_memories(self, **options) -> dict:
        """Bulk delete by session/tags/filters after a dry run; see :func:`tinycontext.memory.browse.delete_memories`."""
        return browse.delete_memories(self, **options)

    def sessions(self) -> list[dict]:
        rows = self.store.read(
            "SELECT s.id, s.created_at, count(m.id), coalesce(sum(m.tokens), 0) FROM sessions s "
            "LEFT JOIN memories m ON m.session_id = s.id GROUP BY s.id ORDER BY s.created_at")
        return [{"session_id": r[0], "created_at": r[1], "memories": r[2], "tokens": r[3]} for r in rows]

    def stats(self) -> dict:
        memories, tokens = self.store.read("SELECT count(*), coalesce(sum(tokens), 0) FROM memories")[0]
        vectors = self.store.read("SELECT count(*) FROM memory_vectors")[0][0]
        return {"memories": memories, "tokens": tokens, "vectors": vectors, "sessions": len(self.sessions()),
                "schema_version": self.store.schema_version, "embedder": self.store.stored_identity(),
                "db_path": str(self.store.path)}


def _nearest(stored: tuple[int, float] | None, vector: np.ndarray, batch: list[tuple[int, np.ndarray]]) -> tuple[int, float] | None:
    """The most similar memory: ``stored`` (the session's nearest) or one saved earlier in this
    batch: (id, cosine)."""
    best = stored
    if batch:
        # Cosine, not the dot product: models with normalize: false give vectors of any length.
        rows = np.stack([v for _, v in batch])
        sims = (rows @ vector) / np.maximum(np.linalg.norm(rows, axis=1) * np.linalg.norm(vector), 1e-12)
        j = int(np.argmax(sims))
        if best is None or sims[j] > best[1]:
            best = (batch[j][0], float(sims[j]))
    return best


def _stored_vector(raw: list[float] | bytes | None, dims: int) -> np.ndarray | None:
    """An imported vector when it has this embedder's size and finite values, else None (embed again)."""
    if raw is None or (isinstance(raw, bytes) and len(raw) != 4 * dims):
        return None
    vector = np.frombuffer(raw, "<f4") if isinstance(raw, bytes) else np.asarray(raw, np.float32)
    if len(vector) != dims or not np.isfinite(vector).all():
        return None
    return vector.astype(np.float32)


def _check_id(memory_id) -> int:
    if isinstance(memory_id, bool):
        raise InvalidInputError("id must be an integer memory id.")
    try:
        value = int(memory_id)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"id must be an integer memory id, got {memory_id!r}.") from exc
    if value < 1 or value >= 2**63:
        raise MemoryNotFoundError(f"No memory with id {value}.")
    return value


# -- module-level API: one engine per configuration ---------------------------------------------

_engines: dict[TinyContextConfig, MemoryEngine] = {}
_engines_lock = threading.Lock()


def get_engine(config: TinyContextConfig | None = None) -> MemoryEngine:
    """The shared engine for ``config`` (defaults when None), opened on first use."""
    config = config or TinyContextConfig()
    with _engines_lock:
        engine = _engines.get(config)
        if engine is None:
            engine = _engines[config] = MemoryEngine(config)
        return engine


def close_engines() -> None:
    with _engines_lock:
        for engine in _engines.values():
            engine.close()
        _engines.clear()


def save_memories(memories, *, session_id: str | None = None, episode: str | None = None,
                  config: TinyContextConfig | None = None) -> dict:
    """Save memories (MemoryInput, dicts or strings) into a session ('default' when None).

    To save a conversation, save each chat session in one call, a turn per memory with its
    ``speaker``, ``occurred_at`` and ``attachments``; the call's turns form one episode."""
    return get_engine(config).save(memories, session_id=session_id, episode=episode)


def recall_memories(query: str, *, session_id: str | None = None, max_tokens: int | None = None, top_k: int | None = None,
                    tags: Sequence[str] | None = None, offset: int = 0, filters: dict | None = None,
                    config: TinyContextConfig | None = None) -> dict:
    """The memories most relevant to ``query`` that fit ``max_tokens``, best first.

    Without ``session_id`` all sessions are searched. ``tags`` keeps memories with any of them;
    ``filters`` (see :mod:`tinycontext.retrieval.filters`) narrows by tags, metadata and time.
    """
    return get_engine(config).recall(query, session_id=session_id, max_tokens=max_tokens, top_k=top_k, tags=tags, offset=offset,
                                     filters=filters)


def get_memory(memory_id: int, *, config: TinyContextConfig | None = None) -> dict:
    return get_engine(config).get(memory_id)


def update_memory(memory_id: int, content: str | None = None, *, tags: Sequence[str] | None = None,
                  metadata: dict | None = None, expected_version: int | None = None, config: TinyContextConfig | None = None) -> dict:
    return get_engine(config).update(memory_id, content, tags=tags, metadata=metadata, expected_version=expected_version)


def delete_memory(memory_id: int, *, config: TinyContextConfig | None = None) -> dict:
    return get_engine(config).delete(memory_id)

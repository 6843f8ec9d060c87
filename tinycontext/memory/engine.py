"""The memory engine: saving, recalling, editing memories in one SQLite file.

``MemoryEngine`` holds an open store and an embedder loaded on first use; it is the API the adapters
call. Its parts: what may be saved (:mod:`.inputs`), the write path (here), recall's pipeline
(:mod:`.recall`, reading through :mod:`.candidates`), browsing and expiry (:mod:`.browse`). The
module-level functions (``save_memories``, ``recall_memories``, ...) reuse one engine per
configuration, so a process pays for opening the database and loading the model once.
"""

from __future__ import annotations

import hashlib
import json
import threading
import unicodedata
import uuid
from typing import Sequence

import numpy as np

from . import browse, codes, facts, keyword_mode as keyword, recall as pipeline
from ..retrieval import conversation, language, postings
from ..budget.tokens import TokenCounter
from .. import telemetry
from ..config import TinyContextConfig
from ..models.backends import NO_MODEL, EmbedderProtocol
from ..errors import ConflictError, InvalidInputError, MemoryNotFoundError
from ..retrieval.filters import Filters
from ..budget.render import Page
from ..retrieval.fusion import Signals
from .candidates import CandidateSearch
from .checks import check_id, check_int, check_query, check_session
from .inputs import MemoryInput, StoredMemory, check_stored, validate_memories
from .store import Store, insert_memories, insert_vectors, now_iso, read_memories, typed_storage_errors
from .vector_index import VectorIndex

DEFAULT_SESSION = "default"
_UNOPENED = object()  # the embedder before its first use


def _content_hash(text: str) -> str:
    canonical = " ".join(unicodedata.normalize("NFC", text).split())
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@typed_storage_errors
class MemoryEngine:
    """An open memory database with its embedder. Thread-safe; close() when done."""

    def __init__(self, config: TinyContextConfig | None = None, *, embedder: EmbedderProtocol | None = None, progress: bool = False):
        self.config = config or TinyContextConfig()
        self._embedder: EmbedderProtocol | None | object = _UNOPENED if embedder is None else embedder
        self.embedding_config = self.config  # what the embedder was opened with (keyword_mode.open_embedder)
        self._reindexed: int | None = None  # None until the embedder is bound to the database
        self._bind_lock = threading.Lock()
        self.keyword_reason: str | None = None
        self.tokens = TokenCounter(self.config.encoding_name)
        self.store = Store(self.config.memory_db_path, readers=self.config.read_connections, write_cache_mib=self.config.write_cache_mib)
        try:
            language.set_tokenizer(self.store, self.config.fts_tokenizer)
            # A new database gets a vector table at once, so counts and deletes never need the model.
            keyword.ensure_vector_table(self.store)
        except BaseException:  # do not leave the file open
            self.store.close()
            raise
        self.index = VectorIndex(self.store, self.config.vector_cache_max, self.config.vector_quantized_max,
                                 self.config.vector_codes_max, self.config.vector_exact_max)
        self.progress = progress
        self.candidate_search = CandidateSearch(self.store, self.index, self.config, lambda: self.embedder)

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
                        self.embedding_config, self._embedder, self.keyword_reason = keyword.open_embedder(self.store, self.config)
                    self._embedder, self._reindexed = keyword.bind(self.store, self.config, self._embedder)
        return self._embedder

    @property
    def reindexed(self) -> int:
        """How many memories binding the embedder (re-)embedded (reindex='auto')."""
        _ = self.embedder
        return self._reindexed

    def reindex(self) -> int:
        """Re-embed every memory whose vector the configured embedder would make otherwise (another
        model, the other graph of the built-in model, an older package model kept under fast); returns how many."""
        with self._bind_lock:
            if self._embedder is _UNOPENED or self.embedding_config is not self.config:
                self.embedding_config, self._embedder, self.keyword_reason = keyword.open_embedder(self.store, self.config, convert=True)
            self._embedder, self._reindexed = keyword.bind(self.store, self.config, self._embedder, convert=True)
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

    def save(self, memories, *, session_id: str | None = None, episode: str | None = None) -> dict:
        """Save memories into a session. ``episode`` names the episode of those that name none;
        without it, one call's memories form a new episode as ``auto_episode`` says."""
        with telemetry.operation("save") as op:
            items = validate_memories(memories, self.config)
            session = check_session(session_id) or DEFAULT_SESSION
            call_episode = conversation.check_label(episode, "episode", conversation.MAX_EPISODE_CHARS, "save")
            return _saved(op, self._write(items, session, call_episode), len(items), self.search_mode)

    def import_memories(self, memories: Sequence[StoredMemory | dict], *, session_id: str | None = None) -> dict:
        """Write exported memories into a session through the same path as :meth:`save` (same
        validation, exact duplicates skipped), keeping what an export carries: ``uid`` (a memory whose
        uid is already here is skipped, so importing twice adds nothing), the id when this database
        never used it (else a new one, reported in ``renumbered``), dates, version, history, and the
        vector when its size fits this embedder (else the text is embedded again)."""
        with telemetry.operation("import") as op:
            items, stored = self.check_import(memories)
            with self.store.bulk():
                written = self._write(items, check_session(session_id) or DEFAULT_SESSION, None, stored)
            return _saved(op, written, len(items), self.search_mode)

    def check_import(self, memories: Sequence[StoredMemory | dict]) -> tuple[list[MemoryInput], list[StoredMemory]]:
        """What :meth:`import_memories` checks before writing, without writing: an importer checks a
        whole file first, so that a bad record refuses all of it."""
        return check_stored(memories, self.config)

    def renumber_links(self, ids: Sequence[int], renumbered: dict[int, int]) -> None:
        """After an import gave some memories new ids: point the imported memories' ``superseded_by``
        at their successors' new ids (joins the import's transaction)."""
        with self.store.write() as conn:
            conn.executemany("UPDATE memories SET superseded_by = ? WHERE superseded_by = ? AND id IN (SELECT value FROM json_each(?))",
                             [(new, old, json.dumps(list(ids))) for old, new in renumbered.items()])

    def ensure_session(self, session_id: str, *, created_at: str | None = None) -> bool:
        """Create a session (with ``created_at``, e.g. kept by an import) unless it exists; True if created."""
        session = check_session(session_id)
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
        # Imports keep what they bring: no near-duplicate check, so no neighbours to look up.
        check = vectors is not None and stored is None and self.config.dedup_mode != "off"
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
                if check:
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
                rows.append((mid, session, item.content, _json(item.tags), _json(item.metadata),
                             digest, tokens[i], born, (restored.updated_at if restored is not None else None) or born,
                             restored.version if restored is not None else 1, item.occurred_at, item.speaker,
                             _json(item.attachments),
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
            insert_memories(conn, rows)
            # The old fact keeps its text and history; it now ends where the new one starts.
            conn.executemany("UPDATE memories SET valid_until = ?, superseded_by = ? WHERE id = ?", supersede)
            conn.executemany("INSERT OR REPLACE INTO memory_versions(memory_id, version, content, tags, metadata, created_at, superseded_at)"
                             " VALUES (?, ?, ?, ?, ?, ?, ?)", history_rows)
            conn.executemany("INSERT OR IGNORE INTO memory_tags(memory_id, tag) VALUES (?, ?)", tag_rows)
            if batch_kept:
                kept_ids, kept_vectors = [mid for mid, _ in batch_kept], np.stack([v for _, v in batch_kept])
                self.index.add(session, kept_ids, insert_vectors(conn, kept_ids, session, kept_vectors))
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

    # -- recall (the pipeline: tinycontext/memory/recall.py) ------------------------------------

    def recall(self, query: str, *, session_id: str | None = None, max_tokens: int | None = None, top_k: int | None = None,
               tags: Sequence[str] | None = None, offset: int = 0, dense_weight: float | None = None,
               rrf_k: float | None = None, candidates: int | None = None, filters: Filters | dict | None = None,
               episode_weight: float | None = None, neighbour_weight: float | None = None, speaker_boost: float | None = None,
               min_dense: float | None = None, score_cliff: float | None = None, time_boost: float | None = None,
               signals: Signals | None = None, ranking: int = 0, fusion: str | None = None, include_superseded: bool = False) -> dict:
        """The library answer: full memory dicts whose content fits ``max_tokens``. Interfaces that
        hand text to an agent use :meth:`recall_rendered`, whose budget covers what they render.
        ``filters`` (see :mod:`tinycontext.retrieval.filters`) narrows by tags, metadata and time.
        ``signals``: this query's :meth:`search`, fused instead of searching again. ``ranking``: also
        return the first ``ranking`` positions of the order the answer was chosen from (ids, ranks,
        scores; no budget), e.g. to score the ranking and the budgeted answer from one recall.
        ``include_superseded``: also return facts a newer memory superseded (left out by default, counted
        in ``superseded``), each marked with ``superseded_by``."""
        return pipeline.recall(self, query, max_tokens=max_tokens, ranking=ranking, session_id=session_id, top_k=top_k, tags=tags,
                               offset=offset, dense_weight=dense_weight, rrf_k=rrf_k, candidates=candidates, filters=filters,
                               episode_weight=episode_weight, neighbour_weight=neighbour_weight, speaker_boost=speaker_boost,
                               min_dense=min_dense, score_cliff=score_cliff, time_boost=time_boost, signals=signals, fusion=fusion,
                               include_superseded=include_superseded)

    def recall_rendered(self, query: str, *, session_id: str | None = None, max_tokens: int | None = None,
                        top_k: int | None = None, tags: Sequence[str] | None = None, offset: int = 0,
                        detail: str = "compact", filters: Filters | dict | None = None, **ranking: float | None) -> Page:
        """Recall as an agent receives it: text and structured content, each within ``max_tokens``
        counted with the configured encoding (see :mod:`tinycontext.budget.render`). ``ranking``: the
        ranking settings :meth:`recall` takes (``dense_weight``, ``rrf_k``, ``candidates``, ``signals``, ...)."""
        return pipeline.recall_rendered(self, query, max_tokens=max_tokens, detail=detail, session_id=session_id, top_k=top_k,
                                        tags=tags, offset=offset, filters=filters, **ranking)

    def rank(self, query: str, *, session_id: str | None = None, top_k: int | None = None, tags: Sequence[str] | None = None,
             offset: int = 0, filters: Filters | dict | None = None, **ranking: float | None) -> pipeline.Ranked:
        """Recall's order before any budget (what :meth:`recall_rendered` renders), to render with
        :meth:`render_recall` once or more without ranking again. Settings as :meth:`recall_rendered`."""
        return pipeline.rank(self, query, session_id=session_id, top_k=top_k, tags=tags, offset=offset, filters=filters, **ranking)

    def render_recall(self, ranked: pipeline.Ranked, *, max_tokens: int | None = None, detail: str = "compact") -> Page:
        """A :meth:`rank` as an agent receives it within ``max_tokens``: ``recall_rendered`` is rank, then this."""
        return pipeline.render(self, ranked, max_tokens=max_tokens, detail=detail)

    def default_min_dense(self) -> float:
        """The relevance floor: ``recall_min_dense`` when set, else the floor the embedding model states
        (a bundle's ``model_config.json`` ``min_dense``, ``embedding_min_dense`` for a server), else the
        default (0.3, tuned for all-MiniLM-L6-v2: other models' cosines live on other scales)."""
        stated = getattr(self.embedder, "min_dense", None)
        if "recall_min_dense" in self.config.model_fields_set or stated is None:
            return self.config.recall_min_dense
        return float(stated)

    def search(self, query: str, *, session_id: str | None = None, tags: Sequence[str] | None = None,
               filters: Filters | dict | None = None, candidates: int | None = None) -> Signals:
        """The candidate lists a recall with these settings fuses: BM25 and (with a model) dense hits,
        each ``candidates`` deep. :meth:`recall` is this search, then fusion, re-ranking, the score
        cliff and the budget; ``recall(..., signals=...)`` runs only the latter on a search done once."""
        query = check_query(query)
        depth, session, tag_list, filters = pipeline.scope(self, session_id, tags, filters, candidates)
        return self.candidate_search.search(query, session, tag_list, filters, depth, keyword=True, dense=self.embedder is not None)


    # -- single memories ----------------------------------------------------------------------

    def get(self, memory_id: int, *, history: bool = True) -> dict:
        memory_id = check_id(memory_id)
        rows = read_memories(self.store, [memory_id])
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
        memory_id = check_id(memory_id)
        if expected_version is not None:
            check_int(expected_version, "expected_version", 1, 2**62)
        # Validate and embed what was given before taking the lock (embedding is the slow part). Who
        # said it, when, and what was shared never change on update, so reading them here is safe.
        given = validate_memories([{"content": "-" if content is None else content, "tags": [] if tags is None else tags,
                                 "metadata": {} if metadata is None else metadata}], self.config)[0]
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
                self.index.replace(row[6], memory_id, codes.put(conn, [memory_id], row[6], vector[None, :]))
            elif self.embedder is None and new_content != row[1]:
                # Keyword-only: the old vector no longer matches; reindex embeds the new text.
                conn.execute("DELETE FROM memory_vectors WHERE memory_id = ?", (memory_id,))
                codes.drop(conn, row[6], [memory_id])
                self.index.remove(row[6], memory_id)
        return self.get(memory_id)

    def delete(self, memory_id: int) -> dict:
        memory_id = check_id(memory_id)
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
        # Sessions are never deleted, so the sessions table (its primary-key index) holds the count;
        # no per-session join over every memory.
        sessions = self.store.read("SELECT count(*) FROM sessions")[0][0]
        with self.store.reading() as conn:
            snapshot = postings.status(conn)  # None: BM25 through FTS5 alone; "used": false past MAX_CHANGES
        return {"memories": memories, "tokens": tokens, "vectors": vectors, "sessions": sessions,
                "schema_version": self.store.schema_version, "embedder": self.store.stored_identity(),
                "db_path": str(self.store.path), "bm25_postings": snapshot}


def _saved(op: telemetry.Operation, report: dict, given: int, mode: str) -> dict:
    """Counts of a save or import report on its span (never ids, texts or the session)."""
    op.set(mode=mode, memories=given, saved=len(report["saved"]), skipped=len(report["skipped"]),
           near_duplicates=len(report["near_duplicates"]), tokens=report["total_tokens"])
    return report


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


def _json(value: list | dict) -> str:
    """A memory's tags, metadata or attachments as stored JSON (most are empty: no encoder call for those)."""
    if not value:
        return "[]" if isinstance(value, list) else "{}"
    return json.dumps(value, ensure_ascii=False)


def _stored_vector(raw: list[float] | bytes | None, dims: int) -> np.ndarray | None:
    """An imported vector when it has this embedder's size and finite values, else None (embed again)."""
    if raw is None or (isinstance(raw, bytes) and len(raw) != 4 * dims):
        return None
    vector = np.frombuffer(raw, "<f4") if isinstance(raw, bytes) else np.asarray(raw, np.float32)
    return vector if len(vector) == dims and np.isfinite(vector).all() else None


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

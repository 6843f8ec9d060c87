"""OpenTelemetry for the standalone servers: an SDK provider configured from the standard ``OTEL_*`` variables.

``tinycontext mcp`` (stdio), ``tinycontext serve`` (MCP over HTTP, REST) and the REST module's ``app``
call :func:`configure`. It sets nothing up unless an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or a
per-signal one) is set or ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` ask for ``otlp``; and nothing
at all under ``OTEL_SDK_DISABLED=true``. ``none`` turns a signal off. The protocol is
``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL``: ``http/protobuf`` (default) or ``grpc``. Everything
else (endpoint paths, headers, timeout, compression, certificates, ``OTEL_TRACES_SAMPLER`` and its
argument, batch and export intervals, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) the SDK and
its exporters read themselves. What is recorded is tinycontext.telemetry's: counts, durations,
outcomes, never payloads; no auto-instrumentation is installed (it would export URLs).
"""

from __future__ import annotations

import os
import sys

from ..errors import ConfigError, MissingExtraError
from ..version import __version__

PROTOCOLS = ("http/protobuf", "grpc")
SIGNALS = ("traces", "metrics")
_configured: dict[str, str] = {}


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def wanted(env: dict[str, str] | os._Environ | None = None) -> dict[str, str]:
    """Signal -> protocol, for the signals the environment asks to export (empty: configure nothing)."""
    env = os.environ if env is None else env
    if _true(env.get("OTEL_SDK_DISABLED")):
        return {}
    out = {}
    for signal in SIGNALS:
        upper = signal.upper()
        exporter = (env.get(f"OTEL_{upper}_EXPORTER") or "").strip().lower()
        endpoint = env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        names = [n.strip() for n in exporter.split(",") if n.strip()]
        if "none" in names:
            continue
        if names and names != ["otlp"]:
            raise ConfigError(f"OTEL_{upper}_EXPORTER={exporter!r}: TinyContext exports OTLP only (otlp or none).")
        if not (endpoint or names):
            continue
        protocol = (env.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
        if protocol not in PROTOCOLS:
            raise ConfigError(f"OTLP protocol {protocol!r} is not supported; use one of {', '.join(PROTOCOLS)}.")
        out[signal] = protocol
    return out


def _exporters(protocol: str):
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise MissingExtraError(f"OTEL_* variables ask for OTLP export ({protocol}), which needs the otel extra "
                                f"({exc.name} is missing): pip install 'tinycontext[otel]'.") from exc
    return OTLPSpanExporter, OTLPMetricExporter


def configure(env: dict[str, str] | None = None) -> dict[str, str]:
    """Install global tracer and meter providers for what :func:`wanted` finds (once per process);
    returns signal -> protocol of what is exported. A provider the process already has is kept."""
    asked = wanted(env)
    if not asked or _configured:
        return dict(_configured)
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; without a name the service is tinycontext.
    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "tinycontext"}))
    if "traces" in asked:
        span_exporter, _ = _exporters(asked["traces"])
        # The sampler comes from OTEL_TRACES_SAMPLER / _ARG; the exporter reads its endpoint, headers and timeout.
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(span_exporter()))
        trace.set_tracer_provider(provider)
        _configured["traces"] = asked["traces"]
    if "metrics" in asked:
        _, metric_exporter = _exporters(asked["metrics"])
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter())]))
        _configured["metrics"] = asked["metrics"]
    print("TinyContext telemetry: OpenTelemetry " + ", ".join(f"{s} over OTLP {p}" for s, p in _configured.items())
          + " (counts, durations and outcomes only).", file=sys.stderr)
    return dict(_configured)


# What FastAPI's own OpenTelemetry support would record (paths, validation errors with their input,
# exception messages and stack traces) is turned off: the REST app passes this as FastAPI(telemetry=...).
FASTAPI_TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False, "auto_configure": False}

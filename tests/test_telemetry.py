"""OpenTelemetry: real servers (stdio MCP, MCP over HTTP, REST) configured by OTEL_* variables export to a local
OTLP receiver (HTTP/protobuf and gRPC), and not one exported byte carries what a caller sent or a page said.

Every input kind carries the marker: query, memory text, tags, metadata key and value, session id, URL path,
domain, page text, search query and results, request headers, the API token, a proxy's credentials, the database
path, a browser session, and the errors they cause (a missing session, an empty memory, a 404 page). The test reads every byte the receiver got.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from netguard import LocalServer, send
from test_web_search import FakeSearx
from tinycontext import telemetry
from tinycontext.errors import ConfigError
from tinycontext.models import hub
from tinycontext.servers import health, otel

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

MARK = "zqxmkr"
TOKEN = f"{MARK}-credential-token-" + "y" * 16
PAGE = (f"<html><head><title>{MARK} title</title></head><body><main><h1>Rivers {MARK}</h1>"
        + "".join(f"<p>The {MARK}-page river number {i} flows through many valleys and towns of Europe.</p>" for i in range(12))
        + "</main></body></html>").encode()
RESULTS = [{"title": f"{MARK} result", "url": f"https://{MARK}-result.example.com/{MARK}", "content": f"{MARK} snippet"}]
# Low export delays, so a short run exports before the server stops (shutdown flushes too).
FAST = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_EXPORTER_OTLP_HEADERS": "x-otlp-tenant=acme"}


class HttpReceiver:
    """An OTLP/HTTP collector on 127.0.0.1: keeps every request's path, headers and body."""

    def __init__(self):
        self.requests: list[tuple[str, dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append((self.path, dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[bytes]:
        return [body for p, _, body in self.requests if p == path]

    def everything(self) -> bytes:
        return b"".join(p.encode() + repr(h).encode() + b for p, h, b in self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class GrpcReceiver:
    """An OTLP/gRPC collector on 127.0.0.1 (raw request bytes, empty answers)."""

    SERVICES = {"traces": "opentelemetry.proto.collector.trace.v1.TraceService",
                "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService"}

    def __init__(self):
        import grpc

        self.requests: list[tuple[str, tuple, bytes]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def handler(signal_name: str, service: str):
            def export(request: bytes, context) -> bytes:
                self.requests.append((signal_name, tuple(context.invocation_metadata()), request))
                return b""

            return grpc.method_handlers_generic_handler(service, {"Export": grpc.unary_unary_rpc_method_handler(export)})

        self.server.add_generic_rpc_handlers([handler(s, name) for s, name in self.SERVICES.items()])
        self.url = f"http://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def bodies(self, signal_name: str) -> list[bytes]:
        return [body for s, _, body in self.requests if s == signal_name]

    def everything(self) -> bytes:
        return b"".join(s.encode() + repr(m).encode() + b for s, m, b in self.requests)

    def close(self):
        self.server.stop(0)


def spans(bodies: list[bytes]) -> list:
    out = []
    for body in bodies:
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope in resource.scope_spans:
                out += list(scope.spans)
    return out


def metric_names(bodies: list[bytes]) -> set[str]:
    return {m.name for body in bodies for r in ExportMetricsServiceRequest.FromString(body).resource_metrics
            for s in r.scope_metrics for m in s.metrics}


def attributes(span) -> dict:
    return {a.key: a.value.string_value or a.value.int_value or a.value.bool_value or a.value.double_value for a in span.attributes}


@pytest.fixture
def site():
    pages = {f"/{MARK}-path/rivers": lambda h: send(h, 200, PAGE),
             f"/{MARK}-path/gone": lambda h: send(h, 404, f"{MARK} not here".encode(), "text/plain"),
             "/search": FakeSearx(results=RESULTS)}
    with LocalServer(pages) as server:
        yield server


def server_env(tmp_path: Path, site, otlp: dict[str, str], **extra: str) -> dict[str, str]:
    folder = tmp_path / f"{MARK}-folder"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TINYCONTEXT_", "OTEL_"))}
    return {**base, "TINYCONTEXT_CONFIG_PATH": str(folder / "config.json"), "TINYCONTEXT_MEMORY_DB_PATH": str(folder / "memory.db"),
            "TINYCONTEXT_MODELS_DIR": str(folder / "models"), "TINYCONTEXT_TOOLS": "memory,web",
            "TINYCONTEXT_ALLOW_PRIVATE_HOSTS": "true", "TINYCONTEXT_SEARCH_BACKEND": "searxng",
            "TINYCONTEXT_SEARXNG_URL": site.url(""),
            # A proxy's credentials are configured (every target bypasses it, so pages still load directly).
            "TINYCONTEXT_PROXY_SERVER": "http://127.0.0.1:9", "TINYCONTEXT_PROXY_USERNAME": f"{MARK}-proxy-user",
            "TINYCONTEXT_PROXY_PASSWORD": f"{MARK}-proxy-password", "TINYCONTEXT_PROXY_BYPASS": "*", **FAST, **otlp, **extra}


def marked_calls(site) -> list[tuple[str, dict]]:
    """Tool calls with the marker in every argument kind; some fail (a missing session, an empty memory, a 404 page)."""
    domain = f"{MARK}-domain.localhost"
    return [
        ("save_memories", {"memories": [{"content": f"The {MARK}-memory lives in Paris near the river.",
                                         "tags": [f"{MARK}-tag"], "metadata": {f"{MARK}-key": f"{MARK}-value"}}],
                           "session_id": f"{MARK}-session"}),
        ("recall_memories", {"query": f"where does the {MARK}-memory live", "session_id": f"{MARK}-session"}),
        ("recall_memories", {"query": f"{MARK} anything", "session_id": f"{MARK}-missing-session"}),
        ("save_memories", {"memories": [{"content": "   ", "tags": [f"{MARK}-tag"]}], "session_id": f"{MARK}-session"}),
        ("scrape_urls", {"items": [{"url": site.url(f"/{MARK}-path/rivers?{MARK}=1", host=domain), "query": f"{MARK} valleys"},
                                   {"url": site.url(f"/{MARK}-path/gone", host=domain)}]}),
        ("search", {"items": [{"query": f"{MARK}-search rivers"}]}),
    ]


def assert_clean(everything: bytes) -> None:
    assert everything, "the receiver got nothing"
    assert MARK.encode() not in everything.lower()
    for leak in (b"localhost", b"/tmp", b"memory.db", b"Traceback", b"Paris", b"http://127.0.0.1"):
        assert leak not in everything, leak


def check_spans(found: list, *, dense: bool) -> None:
    names = {s.name for s in found}
    expected = {"tinycontext.save", "tinycontext.recall", "tinycontext.recall.bm25", "tinycontext.recall.fuse",
                "tinycontext.recall.window", "tinycontext.recall.render", "tinycontext.scrape", "tinycontext.scrape.fetch",
                "tinycontext.scrape.extract", "tinycontext.scrape.chunk", "tinycontext.scrape.rank", "tinycontext.search",
                "tinycontext.search.backend"}
    if dense:
        expected |= {"tinycontext.embed", "tinycontext.recall.dense"}
    assert expected <= names, expected - names
    by_name = {}
    for s in found:
        by_name.setdefault(s.name, []).append(attributes(s))
    assert {"ok", "empty_memory"} <= {a["tinycontext.outcome"] for a in by_name["tinycontext.save"]}
    assert {"ok", "session_not_found"} <= {a["tinycontext.outcome"] for a in by_name["tinycontext.recall"]}
    assert any(a.get("tinycontext.results") == 1 and a.get("tinycontext.tokens", 0) > 0 for a in by_name["tinycontext.recall"])
    assert {"ok", "http_error"} <= {a["tinycontext.outcome"] for a in by_name["tinycontext.scrape.fetch"]}
    saved = [a for a in by_name["tinycontext.save"] if a["tinycontext.outcome"] == "ok"][0]
    assert saved["tinycontext.saved"] == 1 and saved["tinycontext.tokens"] > 0
    assert by_name["tinycontext.search.backend"][0]["tinycontext.backend"] == "searxng"
    if dense:
        assert {a.get("tinycontext.model") for a in by_name["tinycontext.embed"]} == {hub.TIERS[hub.FAST]}
    failed = [s for s in found if s.name == "tinycontext.save" and attributes(s)["tinycontext.outcome"] != "ok"][0]
    assert failed.status.code == 2 and failed.status.message == "" and not failed.events  # ERROR, no description, no exception event
    # The stages are children of their operation: a page's stages run on a worker thread in the scrape's context.
    recall_ids = {s.span_id for s in found if s.name == "tinycontext.recall"}
    assert all(s.parent_span_id in recall_ids for s in found if s.name in ("tinycontext.recall.bm25", "tinycontext.recall.dense"))
    scrape_ids = {s.span_id for s in found if s.name == "tinycontext.scrape"}
    assert all(s.parent_span_id in scrape_ids for s in found if s.name == "tinycontext.scrape.fetch")
    fetch_traces = {s.trace_id for s in found if s.name == "tinycontext.scrape"}
    assert all(s.trace_id in fetch_traces for s in found if s.name in ("tinycontext.scrape.extract", "tinycontext.scrape.rank"))


def check_metrics(bodies: list[bytes]) -> None:
    metrics = [m for body in bodies for r in ExportMetricsServiceRequest.FromString(body).resource_metrics
               for s in r.scope_metrics for m in s.metrics]
    assert {"tinycontext.operation.duration", "tinycontext.items", "tinycontext.tokens"} <= {m.name for m in metrics}
    durations = [p for m in metrics if m.name == "tinycontext.operation.duration" for p in m.histogram.data_points]
    assert durations and all(list(p.explicit_bounds) == list(telemetry.BUCKETS_S) for p in durations)  # seconds buckets
    # Series are split only by the operation, its kind of count and the allow-listed labels.
    allowed = {"tinycontext.operation", "tinycontext.kind", *(telemetry.PREFIX + label for label in telemetry.LABELS)}
    points = durations + [p for m in metrics if m.name != "tinycontext.operation.duration" for p in m.sum.data_points]
    assert all({a.key for a in p.attributes} <= allowed for p in points)
    assert {"session_not_found", "ok"} <= {a.value.string_value for p in durations for a in p.attributes if a.key == "tinycontext.outcome"}


async def call_all(session: ClientSession, site) -> None:
    await session.initialize()
    for tool, arguments in marked_calls(site):
        await session.call_tool(tool, arguments)


def test_stdio_mcp_exports_spans_and_metrics_over_http_protobuf_without_payload(tmp_path, site):
    receiver = HttpReceiver()
    env = server_env(tmp_path, site, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "tinycontext.cli.commands", "mcp"], env=env)
        with anyio.fail_after(180):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await call_all(session, site)

    try:
        anyio.run(main)
        deadline = time.monotonic() + 30  # the server flushes as it exits
        while not receiver.bodies("/v1/metrics") and time.monotonic() < deadline:
            time.sleep(0.1)
        check_spans(spans(receiver.bodies("/v1/traces")), dense=True)
        check_metrics(receiver.bodies("/v1/metrics"))
        assert all(h.get("x-otlp-tenant") == "acme" for _, h, _ in receiver.requests)  # OTEL_EXPORTER_OTLP_HEADERS
        assert_clean(receiver.everything())
    finally:
        receiver.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_serve(env: dict, *args: str, work) -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tinycontext.cli.commands", "serve", *args],
                               env={**env, "MCP_HOST": "127.0.0.1", "MCP_PORT": str(port), "TINYCONTEXT_API_TOKEN": TOKEN},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not health.probe(f"http://127.0.0.1:{port}/health", TOKEN, timeout=2)[0]:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
            time.sleep(0.2)
        work(f"http://127.0.0.1:{port}")
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    assert "OpenTelemetry" in err, err


BROWSER = shutil.which("chromium") is not None and importlib.util.find_spec("playwright") is not None
HEADERS = {"Authorization": f"Bearer {TOKEN}", f"X-{MARK}": f"{MARK}-header", "User-Agent": f"{MARK}-agent"}


def test_mcp_over_http_exports_over_grpc_without_payload(tmp_path, site):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    receiver = GrpcReceiver()
    env = server_env(tmp_path, site, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
                     TINYCONTEXT_EMBEDDING_BACKEND="none")

    def work(base: str) -> None:
        async def main():
            async with httpx.AsyncClient(headers=HEADERS, timeout=60) as http:
                async with streamable_http_client(base + "/mcp", http_client=http) as (read, write, _):
                    async with ClientSession(read, write) as session:
                        await call_all(session, site)

        anyio.run(main)

    try:
        run_serve(env, work=work)
        check_spans(spans(receiver.bodies("traces")), dense=False)
        check_metrics(receiver.bodies("metrics"))
        assert all(("x-otlp-tenant", "acme") in m for _, m, _ in receiver.requests)
        assert_clean(receiver.everything())
    finally:
        receiver.close()


def test_rest_server_exports_without_payload_and_without_fastapi_request_spans(tmp_path, site):
    receiver = HttpReceiver()
    env = server_env(tmp_path, site, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}, TINYCONTEXT_EMBEDDING_BACKEND="none")

    def work(base: str) -> None:
        with httpx.Client(base_url=base, headers=HEADERS, timeout=60) as client:
            for tool, arguments in marked_calls(site):
                client.post(f"/{tool}", json=arguments)
            if BROWSER:
                viewed = client.post("/browser/navigate", json={"url": site.url(f"/{MARK}-path/rivers", host=f"{MARK}-domain.localhost"),
                                                                "session_id": f"{MARK}-browser-session", "find": f"{MARK}"})
                assert viewed.status_code == 200, viewed.text
            # A request the app refuses before any tool runs (its path and body carry the marker too).
            client.post(f"/{MARK}-nowhere", json={MARK: MARK})
            client.post("/save_memories", json={"memories": [{"content": 5, MARK: MARK}]})

    try:
        run_serve(env, "--rest", work=work)
        found = spans(receiver.bodies("/v1/traces"))
        check_spans(found, dense=False)
        if BROWSER:
            assert {"navigate"} == {attributes(s)["tinycontext.action"] for s in found if s.name == "tinycontext.browser"}
        assert all(s.name.startswith("tinycontext.") for s in found)  # FastAPI's own request spans stay off
        check_metrics(receiver.bodies("/v1/metrics"))
        assert not {n for n in metric_names(receiver.bodies("/v1/metrics")) if not n.startswith("tinycontext.")}
        assert_clean(receiver.everything())
    finally:
        receiver.close()


@pytest.mark.parametrize("off", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
                                 {"OTEL_TRACES_SAMPLER": "always_off", "OTEL_METRICS_EXPORTER": "none"}])
def test_switched_off_telemetry_sends_nothing(tmp_path, site, off):
    receiver = HttpReceiver()
    env = server_env(tmp_path, site, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **off}, TINYCONTEXT_EMBEDDING_BACKEND="none")

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "tinycontext.cli.commands", "mcp"], env=env)
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("save_memories", {"memories": [{"content": "one"}]})
                await session.call_tool("recall_memories", {"query": "one"})

    try:
        anyio.run(main)
        time.sleep(1)
        assert not spans(receiver.bodies("/v1/traces"))
        assert not receiver.bodies("/v1/metrics")
    finally:
        receiver.close()


def test_what_the_environment_asks_for():
    assert otel.wanted({}) == {}  # nothing set: nothing is configured
    assert otel.wanted({"OTEL_SERVICE_NAME": "x"}) == {}
    assert otel.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == {"traces": "http/protobuf", "metrics": "http/protobuf"}
    assert otel.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces",
                        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == {"traces": "grpc"}
    assert otel.wanted({"OTEL_TRACES_EXPORTER": "otlp"}) == {"traces": "http/protobuf"}
    assert otel.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "TRUE"}) == {}
    assert otel.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}) == {"metrics": "http/protobuf"}
    with pytest.raises(ConfigError, match="http/json"):
        otel.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ConfigError, match="zipkin"):
        otel.wanted({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_only_allowed_attributes_and_codes_pass():
    op = telemetry.Operation("x", None).set(results=3, outcome="ok", query=f"{MARK}", model=f"{MARK} with spaces",
                                            backend="http://evil", stage=12, tokens=5, url=f"https://{MARK}.example.com")
    assert op.values == {"results": 3, "outcome": "ok", "tokens": 5}
    assert telemetry.error_code(ValueError(f"{MARK} message")) == "internal"
    assert telemetry.error_code(ConfigError(f"{MARK}")) == "config_error"
    assert telemetry.model_label("my-bundle", "my-bundle") == "custom"
    assert telemetry.model_label("sentence-transformers/all-MiniLM-L6-v2", "minilm") == "sentence-transformers/all-MiniLM-L6-v2"


LIBRARY_USER = f"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tinycontext import MemoryEngine, TinyContextConfig

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with MemoryEngine(TinyContextConfig(memory_db_path=sys.argv[1], embedding_backend="none")) as engine:
    with trace.get_tracer("app").start_as_current_span("app.request"):
        engine.save(["{MARK} the library user's memory"], session_id="{MARK}-s")
        engine.recall("{MARK} memory", session_id="{MARK}-s")
print(json.dumps([[s.name, s.parent.span_id if s.parent else None, s.context.span_id, dict(s.attributes)] for s in exporter.get_finished_spans()]))
"""


def test_a_library_user_brings_their_own_provider(tmp_path):
    """No OTEL_* variables and no server: the application's own provider receives the library's spans, as
    children of its own span, and nothing else is set up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TINYCONTEXT_"))}
    done = subprocess.run([sys.executable, "-c", LIBRARY_USER, str(tmp_path / "m.db")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    names = [name for name, *_ in found]
    assert {"tinycontext.save", "tinycontext.recall", "tinycontext.recall.bm25", "app.request"} <= set(names)
    app = next(span_id for name, _, span_id, _ in found if name == "app.request")
    assert all(parent == app for name, parent, _, _ in found if name in ("tinycontext.save", "tinycontext.recall"))
    assert MARK not in json.dumps([attributes for *_, attributes in found])
    assert "OpenTelemetry" not in done.stderr  # the library configured nothing itself

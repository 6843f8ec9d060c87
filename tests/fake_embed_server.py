"""A local embedding server for tests: OpenAI ``/v1/embeddings`` and Ollama ``/api/embed`` on 127.0.0.1.

It serves real vectors from the embedder it is given (the bundled MiniLM in the tests), scaled by 3
so the client's L2-normalisation is exercised, records every request, and can misbehave on demand
(``mode``): wrong dimensions, NaN, non-JSON, HTTP 500 (``fail_first`` times, or always), a hang, or
another model name.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


class EmbedServer:
    def __init__(self, embedder, model: str = "minilm-test"):
        self.embedder, self.model = embedder, model
        self.mode = "ok"
        self.fail_first = 0
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        self.lock = threading.Lock()
        self.url = ""

    def answer(self, path: str, body: dict) -> tuple[int, bytes]:
        with self.lock:
            self.requests.append({"path": path, **body})
            if self.fail_first > 0:
                self.fail_first -= 1
                return 500, b'{"error": "warming up"}'
        mode = self.mode
        if mode == "500":
            return 500, b'{"error": "boom"}'
        if mode == "404":
            return 404, b'{"error": "model not found"}'
        if mode == "hang":
            time.sleep(5)
        if mode == "not_json":
            return 200, b"<html>proxy error</html>"
        if mode == "shape":
            return 200, b'{"something": "else"}'
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vectors = (self.embedder.embed_documents(texts) * 3.0).tolist()
        if mode == "dims":
            vectors = [v[:100] for v in vectors]
        if mode == "nan":
            vectors[0][0] = float("nan")
        if mode == "missing":
            vectors = vectors[:-1]
        model = self.model if mode != "other_model" else "another-model"
        if path == "/api/embed":
            payload = {"model": model, "embeddings": vectors}
        else:
            # Out of order on purpose: clients must sort by index.
            payload = {"object": "list", "model": model,
                       "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in reversed(list(enumerate(vectors)))]}
        # NaN is not JSON; Python writes it as the bare word NaN, as some servers do.
        return 200, json.dumps(payload).encode()


@contextmanager
def embed_server(embedder, **options) -> Iterator[EmbedServer]:
    state = EmbedServer(embedder, **options)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            if self.path not in ("/v1/embeddings", "/api/embed"):
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                time.sleep(state.delay)
                status, data = state.answer(self.path, body)
            finally:
                with state.lock:
                    state.in_flight -= 1
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (timeout test)
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()

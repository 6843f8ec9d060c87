"""A tiny Hugging Face hub on loopback, enough of the protocol for ``hf_hub_download``.

``/{repo_id}/resolve/{revision}/{filename}`` answers HEAD and GET the way huggingface.co does:
``X-Repo-Commit`` always; small files inline with a quoted git-style ETag; large (LFS) files as a
302 to a blob URL on a second port (the "CDN": another origin, as on the real hub, so the client
does not follow it on HEAD) with ``X-Linked-Etag`` (their sha256) and ``X-Linked-Size``; misses as
404 with the hub's ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound). Blobs honour
``Range: bytes=N-`` (resumed downloads). Every request is recorded so tests can count downloads.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

LFS_THRESHOLD = 10 * 1024  # the hub stores bigger files in LFS; the exact cut does not matter here

Files = dict[str, bytes | Path]


class FakeHub:
    """``repos``: {repo_id: {commit: {filename: bytes or Path}}}; ``refs``: {repo_id: {branch: commit}}.

    ``main`` defaults to the last commit listed. While ``blob_gate`` is clear, blob bodies stop after
    their first MiB (so a test can act while a download is in flight); ``cut_blobs`` makes them stop
    halfway and hang up; files named in ``failing`` answer 500, like a hub having a bad moment.
    """

    def __init__(self, repos: dict[str, dict[str, Files]], refs: dict[str, dict[str, str]] | None = None):
        self.repos = repos
        self.refs = {repo: {"main": list(commits)[-1], **(refs or {}).get(repo, {})} for repo, commits in repos.items()}
        self.requests: list[tuple[str, str]] = []
        self.blob_gate = threading.Event()
        self.blob_gate.set()
        self.cut_blobs = False
        self.failing: set[str] = set()
        self._blobs: dict[str, tuple[bytes | Path, str]] = {}  # sha256 -> (content, file name)
        self._sha256: dict[int, str] = {}  # id of a file's value -> its sha256, so HEADs stay cheap
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()  # open keep-alive connections, cut on stop()
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self)) for _ in ("hub", "cdn")]
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return _url(self._servers[0])

    @property
    def cdn_url(self) -> str:
        return _url(self._servers[1])

    def __enter__(self) -> "FakeHub":
        for server in self._servers:
            server.daemon_threads = True
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving, close the ports and cut open connections: the hub becomes unreachable."""
        for server, thread in zip(self._servers, self._threads):
            server.shutdown()
            thread.join(timeout=5)
        self._threads = []
        for server in self._servers:
            server.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def count(self, method: str, path_suffix: str) -> int:
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and p.endswith(path_suffix))

    def _record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def _resolve(self, path: str):
        """(status, headers, body) for a /resolve/ path."""
        repo_id, sep, rest = path.lstrip("/").partition("/resolve/")
        if not sep or repo_id not in self.repos:
            return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, None
        revision, _, filename = rest.partition("/")
        commit = self.refs[repo_id].get(revision, revision)
        files = self.repos[repo_id].get(commit)
        if files is None:
            return 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"}, None
        headers = {"X-Repo-Commit": commit}
        if filename in self.failing:
            return 500, {}, None
        if filename not in files:
            return 404, {**headers, "X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}, None
        data = files[filename]
        size = data.stat().st_size if isinstance(data, Path) else len(data)
        if size < LFS_THRESHOLD:
            body = data.read_bytes() if isinstance(data, Path) else data
            git_sha = hashlib.sha1(b"blob %d\0" % size + body).hexdigest()
            return 200, {**headers, "ETag": f'"{git_sha}"'}, body
        with self._lock:
            sha = self._sha256.get(id(data))
            if sha is None:
                sha = self._sha256[id(data)] = hashlib.sha256(data.read_bytes() if isinstance(data, Path) else data).hexdigest()
            self._blobs[sha] = (data, filename.rsplit("/", 1)[-1])
        return 302, {**headers, "Location": f"{self.cdn_url}/blobs/{sha}", "ETag": f'"{sha}"',
                     "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(size)}, None


def _url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def setup(self):
            super().setup()
            with hub._lock:
                hub._connections.add(self.connection)

        def finish(self):
            with hub._lock:
                hub._connections.discard(self.connection)
            super().finish()

        def do_HEAD(self):
            self._serve(send_body=False)

        def do_GET(self):
            self._serve(send_body=True)

        def _serve(self, send_body: bool):
            path = unquote(self.path.split("?", 1)[0])
            hub._record(self.command, path)
            if path.startswith("/blobs/"):
                return self._blob(path.removeprefix("/blobs/"), send_body)
            status, headers, body = hub._resolve(path)
            self._send(status, headers, body or b"", send_body)

        def _send(self, status: int, headers: dict, body: bytes, send_body: bool):
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def _blob(self, sha: str, send_body: bool):
            with hub._lock:
                data, name = hub._blobs.get(sha, (None, ""))
            if data is None:
                return self._send(404, {}, b"", send_body)
            body = data.read_bytes() if isinstance(data, Path) else data
            start = 0
            status = 200
            # The CDN names the file; huggingface_hub shows that name on its progress bar.
            headers = {"ETag": f'"{sha}"', "Accept-Ranges": "bytes",
                       "Content-Disposition": f'attachment; filename="{name}";'}
            range_header = self.headers.get("Range", "")
            if range_header.startswith("bytes=") and range_header.endswith("-"):
                start = int(range_header[len("bytes="):-1])
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            part = body[start:]
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if not send_body:
                return
            if hub.cut_blobs:  # promise the whole body, send half, hang up
                self.wfile.write(part[: len(part) // 2])
                self.close_connection = True
                return
            step = 1 << 20
            self.wfile.write(part[:step])
            hub.blob_gate.wait(timeout=60)
            self.wfile.write(part[step:])

    return Handler

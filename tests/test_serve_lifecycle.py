"""`tinycontext serve` as a long-running service (what the Docker image runs): it opens the engine
before listening, refuses bad settings with a clear message, answers /health, and on SIGTERM
finishes requests in flight, checkpoints the WAL and exits 0, keeping every acknowledged save."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tinycontext.errors import ConfigError
from tinycontext.servers import health
from tinycontext.servers.guard import ServeSettings, read_token

TOKEN = "lifecycle-test-token-" + "x" * 12
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(env: dict, *args: str, port: int) -> subprocess.Popen:
    full = {**os.environ, **env, "MCP_HOST": "127.0.0.1", "MCP_PORT": str(port), "TINYCONTEXT_API_TOKEN": TOKEN}
    return subprocess.Popen([sys.executable, "-m", "tinycontext.cli.commands", "serve", *args], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_healthy(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        healthy, _ = health.probe(f"http://127.0.0.1:{port}/health", TOKEN, timeout=2)
        if healthy:
            return
        time.sleep(0.2)
    process.kill()
    pytest.fail("server did not become healthy")


def stop(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    return process.returncode, err


def stored_contents(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT content FROM memories")}


@pytest.mark.slow
@pytest.mark.parametrize("rest", [False, True], ids=["mcp", "rest"])
def test_sigterm_during_a_burst_keeps_every_acknowledged_save_and_checkpoints(env, rest):
    port = free_port()
    process = start_server(env, *(["--rest"] if rest else []), port=port)
    wait_healthy(process, port)
    base = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []

    def rest_burst(worker: int) -> None:
        with httpx.Client(base_url=base, headers=AUTH, timeout=30) as client:
            for n in range(100_000):
                content = f"burst memory {worker}-{n} about topic {n % 17}"
                try:
                    response = client.post("/save_memories", json={"memories": [{"content": content}]})
                except httpx.HTTPError:
                    return  # the server stopped accepting: this save was never acknowledged
                if response.status_code == 200:
                    acknowledged.append(content)

    async def mcp_burst(worker: int) -> None:
        # Each client holds an MCP session (and its event stream) open across the stop signal.
        async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
            async with streamable_http_client(base + "/mcp", http_client=http) as (read, write, _):
                # A request the stopped server never answers would otherwise wait for the SDK's default timeout.
                async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=10)) as session:
                    await session.initialize()
                    for n in range(100_000):
                        content = f"burst memory {worker}-{n} about topic {n % 17}"
                        saved = await session.call_tool("save_memories", {"memories": [{"content": content}]})
                        if not saved.isError:
                            acknowledged.append(content)

    def run_mcp_burst(worker: int) -> None:
        try:
            anyio.run(mcp_burst, worker)
        except BaseException:  # noqa: BLE001 - the server going away ends the client; only acknowledged saves count
            pass

    threads = [threading.Thread(target=run_mcp_burst if not rest else rest_burst, args=(w,), daemon=True) for w in range(3)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < 20 and process.poll() is None and any(thread.is_alive() for thread in threads):
        time.sleep(0.05)
    code, err = stop(process)
    for thread in threads:
        thread.join(60)
    assert code == 0, err
    db = Path(env["TINYCONTEXT_MEMORY_DB_PATH"])
    assert not Path(str(db) + "-wal").exists()  # checkpointed into the database file on close
    assert len(acknowledged) >= 20 and set(acknowledged) <= stored_contents(db)


def test_open_bind_without_token_says_how_to_fix_it(env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_API_TOKEN")}
    full.update(env, MCP_HOST="0.0.0.0", MCP_PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", "serve"], env=full, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("config_error: Refusing to listen on 0.0.0.0 without authentication")
    assert "TINYCONTEXT_API_TOKEN " in done.stderr and "TINYCONTEXT_API_TOKEN_FILE" in done.stderr
    assert "secrets.token_urlsafe" in done.stderr
    assert not Path(env["TINYCONTEXT_MEMORY_DB_PATH"]).exists()


def test_token_from_a_secret_file(tmp_path):
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    assert read_token({"TINYCONTEXT_API_TOKEN_FILE": str(secret)}) == TOKEN
    assert read_token({"TINYCONTEXT_API_TOKEN": "another-token-of-enough-length", "TINYCONTEXT_API_TOKEN_FILE": str(secret)}) \
        == "another-token-of-enough-length"
    ServeSettings.from_env({"MCP_HOST": "0.0.0.0", "TINYCONTEXT_API_TOKEN_FILE": str(secret)}).check_bind()
    (tmp_path / "short").write_text("short")
    (tmp_path / "empty").write_text("\n")
    for path, message in ((tmp_path / "missing", "Cannot read the token file"), (tmp_path / "empty", "is empty"),
                          (tmp_path / "short", "at least 24 characters")):
        with pytest.raises(ConfigError, match=message):
            read_token({"TINYCONTEXT_API_TOKEN_FILE": str(path)})


def test_port_in_use_is_a_clear_error(env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_server(env, port=port)
        _, err = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "address already in use" in err and f"could not start on 127.0.0.1:{port}" in err and "MCP_PORT" in err


def test_corrupt_database_stops_the_server_before_it_listens_and_stays_untouched(env):
    db = Path(env["TINYCONTEXT_MEMORY_DB_PATH"])
    garbage = b"this is not a database" * 1000
    db.write_bytes(garbage)
    port = free_port()
    process = start_server(env, port=port)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1 and err.startswith("storage_error: Cannot use database")
    assert db.read_bytes() == garbage


@pytest.mark.slow
def test_health_route_and_probe(env, monkeypatch):
    port = free_port()
    process = start_server(env, port=port)
    try:
        wait_healthy(process, port)
        url = f"http://127.0.0.1:{port}/health"
        assert httpx.get(url).status_code == 401
        body = httpx.get(url, headers=AUTH).json()
        assert body["status"] == "ok" and body["embedder"] == "minilm-l6-tuned3"
        healthy, said = health.probe(url, "wrong-token-of-enough-length")
        assert not healthy and said.startswith("HTTP 401")
        monkeypatch.setenv("MCP_PORT", str(port))
        monkeypatch.setenv("TINYCONTEXT_API_TOKEN", TOKEN)
        assert health.main() == 0
        monkeypatch.setenv("TINYCONTEXT_API_TOKEN", "wrong-token-of-enough-length")
        assert health.main() == 1
    finally:
        code, err = stop(process)
    assert code == 0, err
    monkeypatch.setenv("TINYCONTEXT_API_TOKEN", TOKEN)
    assert health.main() == 1  # nothing listens any more

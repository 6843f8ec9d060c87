"""`tinycontext doctor`: a ready setup passes; each broken piece fails with its code and what to fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import sqlite_vec
from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.cli.doctor import render, run_checks
from tinycontext.models.hub import BUILTIN_NAME, DERIVED, FAST, MANIFEST, TIERS
from tinycontext.memory.store import SCHEMA_VERSION
from tinycontext.sqlite import sqlite_driver


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    return subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", "doctor", *args], capture_output=True, text=True, check=False,
                          env={**base, **env}, timeout=120)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_ready_setup_exits_zero(env, tmp_path):
    proc = doctor(env, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    by_name = checks(report)
    assert report["ok"] and all(c["ok"] for c in report["checks"])
    assert list(by_name) == ["python", "config", "sqlite", "fts5", "sqlite-vec", "model", "embedding", "tokenizer", "database", "browser", "mcp tools",
                            "telemetry", "proxies"]
    assert by_name["sqlite"]["details"]["driver"] == sqlite_driver()[0].__name__
    assert by_name["fts5"]["details"]["available"] is True
    assert by_name["sqlite-vec"]["details"]["version"] == f"v{sqlite_vec.__version__}"
    model = by_name["model"]["details"]
    assert (model["name"], model["sha256"], model["sha256_verified"]) == (TIERS[FAST], DERIVED[TIERS[FAST]].sha256, True)
    assert by_name["embedding"]["details"]["dimensions"] == model["dimensions"]
    assert by_name["tokenizer"]["details"]["encoding"] == "o200k_base"
    assert report["config"]["memory_db_path"] == env["TINYCONTEXT_MEMORY_DB_PATH"]
    assert "TINYCONTEXT_MEMORY_DB_PATH" in by_name["config"]["details"]["sources"]
    # Doctor reports a missing database without creating it.
    assert by_name["database"]["details"] == {"exists": False}
    # ... and the MCP profile: the tools it lists and what their definitions cost every request.
    tools = by_name["mcp tools"]
    assert tools["details"]["tools"] == ["save_memories", "recall_memories"] and tools["details"]["capabilities"] == ["memory"]
    assert tools["summary"].startswith("profile memory: 2 MCP tools") and "off: manage, web, browser" in tools["summary"]
    assert 0 < tools["details"]["schema_tokens"] <= 450
    assert not (tmp_path / "db").exists()

    text = doctor(env)
    assert text.returncode == 0 and text.stdout.rstrip().endswith("Ready.")

    assert DERIVED[TIERS[FAST]].sha256[:12] in text.stdout


def test_telemetry_and_proxies_are_reported_without_the_password(env):
    secret = "doctor-proxy-password-123"
    proc = doctor({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                   "TINYCONTEXT_PROXY_SERVER": "http://127.0.0.1:3128,socks5://127.0.0.1:1080", "TINYCONTEXT_PROXY_USERNAME": "me",
                   "TINYCONTEXT_PROXY_PASSWORD": secret, "TINYCONTEXT_PROXY_BYPASS": "intranet.example"}, "--json")
    by_name = checks(json.loads(proc.stdout))
    assert by_name["telemetry"]["ok"] and by_name["telemetry"]["details"]["signals"] == {"traces": "grpc", "metrics": "grpc"}
    assert by_name["proxies"]["ok"] and by_name["proxies"]["details"] == {
        "proxies": ["http://127.0.0.1:3128", "socks5://127.0.0.1:1080"], "bypass": ["intranet.example"]}
    assert "with credentials" in by_name["proxies"]["summary"]
    assert secret not in proc.stdout + proc.stderr
    off = checks(json.loads(doctor({**env, "OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "--json").stdout))
    assert off["telemetry"]["details"]["signals"] == {} and off["proxies"]["details"] == {"proxies": []}


def test_existing_database_is_inspected_read_only(env, tmp_path, real_embedder):
    config = TinyContextConfig(memory_db_path=env["TINYCONTEXT_MEMORY_DB_PATH"], models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=real_embedder) as engine:
        engine.save(["One fact.", "Another fact."], session_id="s1")
    db = Path(env["TINYCONTEXT_MEMORY_DB_PATH"])
    before = db.read_bytes()

    report = run_checks()
    database = checks(report)["database"]
    assert report["ok"], render(report)
    assert (database["details"]["schema_version"], database["details"]["memories"], database["details"]["sessions"],
            database["details"]["vectors"]) == (SCHEMA_VERSION, 2, 1, 2)
    assert database["details"]["embedder"] == real_embedder.identity
    assert db.read_bytes() == before


def test_database_built_by_another_model(env, tmp_path):
    config = TinyContextConfig(memory_db_path=env["TINYCONTEXT_MEMORY_DB_PATH"], models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        engine.save(["One fact."])
    report = run_checks()
    database = checks(report)["database"]
    assert not report["ok"] and database["error"]["code"] == "model_mismatch"
    assert "tinycontext reindex" in database["summary"]


def _bundle_copy(tmp_path: Path, name: str) -> Path:
    """A bundle folder with the built-in model's tokenizer and config and a model file we control."""
    folder = tmp_path / name
    source = Path(str(resources.files("tinycontext") / "data" / "models" / BUILTIN_NAME))
    shutil.copytree(source, folder)
    return folder


def _corrupt_model(tmp_path: Path) -> Path:
    folder = _bundle_copy(tmp_path, "corrupt")
    (folder / "model.onnx").write_bytes(b"this is not an ONNX graph")
    return folder / "model.onnx"


def _tampered_download(tmp_path: Path) -> Path:
    folder = _bundle_copy(tmp_path, "tampered")
    (folder / "model.onnx").write_bytes(b"replaced after download")
    (folder / MANIFEST).write_text(json.dumps({"repo_id": "org/model", "revision": "abc", "model_file": "model.onnx", "sha256": "0" * 64}))
    return folder / "model.onnx"


@pytest.mark.parametrize("broken", [
    pytest.param(lambda tmp: tmp / "no-such-model", id="missing-folder"),
    pytest.param(_corrupt_model, id="corrupt-onnx"),
    pytest.param(_tampered_download, id="sha256-mismatch"),
])
def test_broken_model_fails_with_path(env, tmp_path, monkeypatch, broken):
    path = broken(tmp_path)
    model = path if path.is_dir() or not path.exists() else path.parent
    monkeypatch.setenv("TINYCONTEXT_EMBEDDING_MODEL", str(model))
    report = run_checks()
    failed = [c for c in report["checks"] if not c["ok"] and "error" in c]
    assert not report["ok"] and len(failed) == 1
    assert failed[0]["error"]["code"] == "model_unavailable" and str(path) in failed[0]["summary"]
    # Checks that need the model are skipped rather than failing with a second, confusing error.
    assert all(c.get("skipped") for c in report["checks"] if not c["ok"] and "error" not in c)


def test_broken_model_exit_code(env, tmp_path):
    path = _corrupt_model(tmp_path)
    proc = doctor({**env, "TINYCONTEXT_EMBEDDING_MODEL": str(path.parent)})
    assert proc.returncode == 1
    assert "model_unavailable" in proc.stdout and str(path) in proc.stdout
    assert proc.stdout.rstrip().endswith("run `tinycontext doctor` again.")


def test_bad_config_file(env, tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"recall_top_k": 0}')
    report = run_checks()
    by_name = checks(report)
    assert not report["ok"] and by_name["config"]["error"]["code"] == "config_error"
    assert by_name["python"]["ok"] and by_name["sqlite"]["ok"]
    assert by_name["model"]["skipped"] and report["paths"]["config_file"] == str(tmp_path / "config.json")


def test_foreign_database_and_unknown_variables(env, tmp_path, monkeypatch):
    """Another application's SQLite file fails the database check (and stays as it was); a misspelled
    TINYCONTEXT_* variable shows in the config check with the real name (issue 19)."""
    import sqlite3

    db = Path(env["TINYCONTEXT_MEMORY_DB_PATH"])
    raw = sqlite3.connect(db)
    raw.executescript("CREATE TABLE photos(id INTEGER PRIMARY KEY); PRAGMA user_version = 0;")
    raw.close()
    before = db.read_bytes()
    monkeypatch.setenv("TINYCONTEXT_RECAL_TOP_K", "3")
    report = run_checks()
    by_name = checks(report)
    assert not report["ok"] and by_name["database"]["error"]["code"] == "storage_error"
    assert "another application's SQLite database" in by_name["database"]["summary"] and db.read_bytes() == before
    assert by_name["config"]["ok"] and "TINYCONTEXT_RECAL_TOP_K (did you mean TINYCONTEXT_RECALL_TOP_K?)" in by_name["config"]["summary"]
    assert by_name["config"]["details"]["unknown_variables"] == ["TINYCONTEXT_RECAL_TOP_K"]

"""Faults: a writer killed with SIGKILL mid-batch, and broken model files (engine and over HTTP)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.errors import ModelUnavailableError
from tinycontext.models.hub import MANIFEST
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background
from conftest import suite_embedder
from consistency import assert_consistent

TESTS = Path(__file__).resolve().parent
BATCH = 25

WRITER = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
from conftest import suite_embedder
from tinycontext import MemoryEngine, TinyContextConfig
config = TinyContextConfig(memory_db_path=sys.argv[1], models_dir=sys.argv[1] + ".models")
with MemoryEngine(config, embedder=suite_embedder()) as engine:
    for batch in range(10_000):
        memories = [f"batch {{batch}} item {{i}} about topic{{(batch * {BATCH} + i) % 97}}" for i in range({BATCH})]
        result = engine.save(memories, session_id=f"s{{batch % 3}}")
        print(json.dumps({{"batch": batch, "ids": result["ids"]}}), flush=True)
"""


def test_sigkill_mid_batch_loses_nothing_acknowledged(tmp_path):
    db = tmp_path / "killed.db"
    acked: dict[int, list[int]] = {}
    for _round in range(2):  # kill, restart the writer on the same file, kill again
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
        try:
            while len(acked) < 6 * (_round + 1):
                line = writer.stdout.readline()
                assert line, "writer exited early"
                ack = json.loads(line)
                acked[len(acked)] = ack["ids"]
            time.sleep(0.005 * (_round + 1))  # land inside a later batch's embed or transaction
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=30)
        assert writer.returncode == -signal.SIGKILL
    config = TinyContextConfig(memory_db_path=db, models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=suite_embedder()) as engine:
        store = engine.store
        ids = list(assert_consistent(engine))
        assert len(ids) % BATCH == 0  # a batch is one transaction: all of it or none
        wanted = [i for batch in acked.values() for i in batch]
        assert set(wanted) <= set(ids) and len(wanted) == len(set(wanted))
        hits = engine.recall("topic5", top_k=50)["memories"]
        assert hits and all("topic5" in m["content"] for m in hits[:1])


def _bundle(tmp_path: Path, shared_dir: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(shared_dir / "models" / "minilm-l6-int8", folder)
    return folder


def _broken_models(tmp_path, shared_dir):
    wrong_sha = _bundle(tmp_path, shared_dir, "wrong-sha")
    (wrong_sha / MANIFEST).write_text(json.dumps({"model_file": "model.onnx", "sha256": "0" * 64, "revision": "x"}))
    corrupt = _bundle(tmp_path, shared_dir, "corrupt")
    (corrupt / "model.onnx").write_bytes(b"this is not an onnx graph" * 100)
    missing = _bundle(tmp_path, shared_dir, "missing")
    (missing / "model.onnx").unlink()
    return {"wrong sha256": (wrong_sha, wrong_sha / "model.onnx"), "corrupt": (corrupt, corrupt / "model.onnx"),
            "missing": (missing, missing / "model.onnx"), "no folder": (tmp_path / "nowhere", tmp_path / "nowhere")}


def test_broken_model_is_model_unavailable_with_its_path(tmp_path, shared_dir):
    for why, (folder, path) in _broken_models(tmp_path, shared_dir).items():
        config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_model=str(folder))
        with pytest.raises(ModelUnavailableError) as caught, MemoryEngine(config) as engine:
            engine.recall("anything")  # the model loads on first use
        assert str(path) in caught.value.message, why
        with background(create_app(config, settings=ServeSettings())) as base:
            for _ in range(2):  # still answering, still the same clear error
                response = httpx.post(base + "/recall_memories", json={"query": "anything"}, timeout=60)
                body = response.json()
                assert (response.status_code, body["code"]) == (503, "model_unavailable"), why
                assert str(path) in body["message"] and "Traceback" not in response.text

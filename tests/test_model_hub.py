"""Model resolution and hub downloads, against a real loopback hub (tests/fake_hub.py) serving the
real MiniLM ONNX files from ../shared, so every downloaded model is loaded and really embeds."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fake_hub import FakeHub
from tinycontext.models import hub as model_hub
from tinycontext.models.embedder import Embedder
from tinycontext.errors import ModelUnavailableError
from tinycontext.models.hub import MANIFEST, RegistryEntry, local_bundle, resolve_model

C1 = "1" * 40
C2 = "2" * 40
REPO_ID = "acme/minilm"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def hub_online(monkeypatch):
    """These tests talk to a local fake hub: a user's HF_HUB_OFFLINE=1 (read once, at import) must not apply."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def qint8(shared_dir) -> Path:
    return shared_dir / "models" / "minilm-l6-qint8"


@pytest.fixture(scope="module")
def int8(shared_dir) -> Path:
    return shared_dir / "models" / "minilm-l6-int8"


def st_repo(model_dir: Path) -> dict:
    """A sentence-transformers style repo: no model_config.json, the ONNX export under onnx/."""
    return {
        "onnx/model.onnx": model_dir / "model.onnx",
        "tokenizer.json": model_dir / "tokenizer.json",
        "config.json": json.dumps({"hidden_size": 384, "max_position_embeddings": 512}).encode(),
        "1_Pooling/config.json": json.dumps({"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True}).encode(),
        "sentence_bert_config.json": json.dumps({"max_seq_length": 256}).encode(),
    }


@pytest.fixture
def hub(qint8, int8):
    with FakeHub({REPO_ID: {C1: st_repo(qint8), C2: st_repo(int8)}}) as server:
        yield server


def embed(bundle, text="Where did the meeting take place?"):
    return Embedder(bundle, cache_size=0).embed_query(text)


def manifest(bundle) -> dict:
    return json.loads((bundle.path / MANIFEST).read_text())


def hub_sha(hub: FakeHub, commit: str) -> str:
    return sha256(hub.repos[REPO_ID][commit]["onnx/model.onnx"])


def test_sentence_transformers_repo_is_inferred_downloaded_and_embeds(hub, qint8, tmp_path):
    bundle = resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    assert (bundle.name, bundle.revision, bundle.dimensions, bundle.max_tokens, bundle.pooling) == (REPO_ID, C1, 384, 256, "mean")
    assert bundle.path == tmp_path / "acme--minilm" / C1
    assert bundle.sha256 == sha256(qint8 / "model.onnx") == manifest(bundle)["sha256"]
    assert sha256(bundle.model_file) == bundle.sha256
    # The downloaded copy embeds exactly like the original folder.
    np.testing.assert_allclose(embed(bundle), embed(local_bundle(qint8)), atol=1e-6)


def test_repo_with_model_config_json_is_used_as_is(qint8, tmp_path):
    config = {"dimensions": 384, "max_tokens": 128, "pooling": "cls", "query_prefix": "query: ", "model_file": "model.onnx"}
    files = {"model.onnx": qint8 / "model.onnx", "tokenizer.json": qint8 / "tokenizer.json",
             "model_config.json": json.dumps(config).encode()}
    with FakeHub({"acme/bundle": {C1: files}}) as server:
        bundle = resolve_model(f"acme/bundle@{C1}", tmp_path, endpoint=server.url)
        assert server.count("HEAD", "/1_Pooling/config.json") == 0  # nothing inferred
    assert (bundle.name, bundle.max_tokens, bundle.pooling, bundle.query_prefix) == ("acme/bundle", 128, "cls", "query: ")
    assert bundle.model_file == bundle.path / "model.onnx"
    assert Embedder(bundle).identity["query_prefix"] == "query: "
    assert embed(bundle).shape == (384,)


def test_registry_entry_and_tier_download_the_pinned_commit(hub, int8, tmp_path, monkeypatch):
    entry = RegistryEntry("test-minilm", REPO_ID, C2, "onnx/model.onnx", 384, 256, "mean", query_prefix="q: ")
    monkeypatch.setitem(model_hub.REGISTRY, entry.name, entry)
    monkeypatch.setitem(model_hub.TIERS, "balanced", entry.name)
    bundle = resolve_model("balanced", tmp_path, endpoint=hub.url)
    assert (bundle.name, bundle.revision, bundle.query_prefix) == ("test-minilm", C2, "q: ")
    assert bundle.path == tmp_path / "test-minilm" / C2
    assert bundle.sha256 == sha256(int8 / "model.onnx")
    assert hub.count("HEAD", "/config.json") == 0  # the entry says everything: no inference
    assert resolve_model("test-minilm", tmp_path, endpoint=hub.url) == bundle


def test_revision_is_honoured_and_a_branch_is_pinned_to_its_commit(hub, qint8, int8, tmp_path):
    first = resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    second = resolve_model(f"{REPO_ID}@{C2}", tmp_path, endpoint=hub.url)
    assert first.sha256 == sha256(qint8 / "model.onnx") != second.sha256 == sha256(int8 / "model.onnx")
    latest = resolve_model(REPO_ID, tmp_path, endpoint=hub.url)  # main -> C2
    assert latest.path.name == "main" and latest.revision == C2 and latest.sha256 == second.sha256
    assert manifest(latest)["revision"] == C2 and manifest(latest)["requested_revision"] == "main"
    # Every file was fetched at the resolved commit, never at the moving branch name.
    assert not [p for m, p in hub.requests if m == "GET" and "/resolve/main/" in p]


def test_second_resolve_reads_disk_only(hub, tmp_path):
    bundle = resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    requests = len(hub.requests)
    assert hub.count("GET", f"/blobs/{bundle.sha256}") == 1
    assert resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url) == bundle
    assert len(hub.requests) == requests
    hub.stop()
    again = resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    assert again == bundle and embed(again).shape == (384,)


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "delete"])
def test_model_file_is_verified_on_every_load(hub, tmp_path, damage):
    bundle = resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    model = bundle.model_file
    if damage == "flip_byte":
        with open(model, "r+b") as fh:  # in place: same size, same inode
            fh.seek(model.stat().st_size // 2)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "truncate":
        with open(model, "r+b") as fh:
            fh.truncate(model.stat().st_size - 1)
    else:
        model.unlink()
    hub.stop()  # loading must not try to "repair" silently from the network
    with pytest.raises(ModelUnavailableError) as info:
        resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    err = info.value
    assert err.code == "model_unavailable"
    assert str(model) in err.message and f"Delete {bundle.path}" in err.message


def test_unreachable_hub_fails_fast_and_says_what_to_do(hub, tmp_path):
    hub.stop()
    with pytest.raises(ModelUnavailableError) as info:
        resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    message = info.value.message
    assert "Offline?" in message and "embedding_model='fast'" in message and "HF_ENDPOINT" in message
    assert not list(tmp_path.rglob(MANIFEST))


@pytest.mark.parametrize("spec, expected", [
    ("acme/nothing", "has no repo 'acme/nothing'"),
    (f"{REPO_ID}@{'9' * 40}", f"has no revision '{'9' * 40}'"),
])
def test_missing_repo_or_revision(hub, tmp_path, spec, expected):
    with pytest.raises(ModelUnavailableError) as info:
        resolve_model(spec, tmp_path, endpoint=hub.url)
    assert expected in info.value.message


def test_repo_without_onnx_export(qint8, tmp_path):
    files = st_repo(qint8)
    del files["onnx/model.onnx"]
    with FakeHub({"acme/torch-only": {C1: files}}) as server:
        with pytest.raises(ModelUnavailableError, match="has no ONNX export"):
            resolve_model("acme/torch-only", tmp_path, endpoint=server.url)


def test_model_config_naming_a_missing_file(qint8, tmp_path):
    files = {"tokenizer.json": qint8 / "tokenizer.json",
             "model_config.json": json.dumps({"dimensions": 384, "model_file": "onnx/model_O4.onnx"}).encode()}
    with FakeHub({"acme/broken": {C1: files}}) as server:
        with pytest.raises(ModelUnavailableError) as info:
            resolve_model("acme/broken", tmp_path, endpoint=server.url)
    assert "onnx/model_O4.onnx" in info.value.message and "lacks a file the bundle needs" in info.value.message


@pytest.fixture
def no_retry_wait(monkeypatch):
    """huggingface_hub retries failed requests with waits of 1-8 s; keep the retries, skip the waiting."""
    import huggingface_hub.file_download as file_download
    import huggingface_hub.utils._http as http

    for module in (file_download, http):
        monkeypatch.setattr(module, "time", SimpleNamespace(sleep=lambda seconds: None))


def test_hub_failing_mid_download_is_not_taken_for_a_missing_file(qint8, tmp_path, no_retry_wait):
    files = {**st_repo(qint8), "model_config.json": json.dumps({"dimensions": 384, "pooling": "cls", "model_file": "onnx/model.onnx"}).encode()}
    with FakeHub({"acme/flaky": {C1: files}}) as server:
        server.failing = {"model_config.json"}
        with pytest.raises(ModelUnavailableError, match="Offline\\?"):
            resolve_model("acme/flaky", tmp_path, endpoint=server.url)
        assert server.count("HEAD", "/1_Pooling/config.json") == 0  # no guessing a config in its place
        server.failing = set()
        assert resolve_model("acme/flaky", tmp_path, endpoint=server.url).pooling == "cls"


def test_interrupted_download_leaves_no_partial_model(hub, tmp_path, no_retry_wait):
    hub.cut_blobs = True
    with pytest.raises(ModelUnavailableError, match="Could not download"):
        resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url)
    folder = tmp_path / "acme--minilm" / C1
    assert not (folder / "onnx" / "model.onnx").exists() and not (folder / MANIFEST).exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".incomplete")]
    hub.cut_blobs = False
    assert resolve_model(f"{REPO_ID}@{C1}", tmp_path, endpoint=hub.url).sha256 == hub_sha(hub, C1)


RESOLVE_SCRIPT = """
import json, sys
from pathlib import Path
import filelock, huggingface_hub  # imported before "ready", so the resolve below starts at once
from tinycontext.models.hub import resolve_model
print("ready", flush=True)
b = resolve_model(sys.argv[1], Path(sys.argv[2]), endpoint=sys.argv[3] if len(sys.argv) > 3 else None)
print(json.dumps({"sha256": b.sha256, "revision": b.revision, "model_file": str(b.model_file)}))
"""


def run_resolve(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RESOLVE_SCRIPT, *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_share_one_download(hub, tmp_path):
    spec = f"{REPO_ID}@{C1}"
    resolve_model(spec, tmp_path / "alone", endpoint=hub.url)
    one_download = len(hub.requests)  # what a single download asks of the hub
    model_blob = f"/blobs/{hub_sha(hub, C1)}"
    models_dir = tmp_path / "shared"
    hub.blob_gate.clear()  # the first process's model download stalls after 1 MiB...
    first = run_resolve(spec, str(models_dir), hub.url)
    deadline = time.monotonic() + 60
    while hub.count("GET", model_blob) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = run_resolve(spec, str(models_dir), hub.url)
    assert second.stdout.readline() == "ready\n"
    time.sleep(1.5)  # ...while the second one reaches the lock (without it, it would query the hub now)
    hub.blob_gate.set()
    results = [p.communicate(timeout=60) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], results
    a, b = (json.loads(out.splitlines()[-1]) for out, _ in results)
    assert a == b
    assert a["sha256"] == hub_sha(hub, C1) == sha256(Path(a["model_file"]))
    # The second process waited on the lock and reused the first one's download, asking the hub nothing.
    assert len(hub.requests) == 2 * one_download and hub.count("GET", model_blob) == 2
    assert not [p for p in models_dir.rglob("*") if p.name.endswith(".incomplete")]


def test_hf_endpoint_env_and_progress_bar_on_stderr(hub, tmp_path):
    # TQDM_POSITION=-1 is huggingface_hub's switch to draw bars even when stderr is not a terminal.
    proc = run_resolve(f"{REPO_ID}@{C2}", str(tmp_path), env={"HF_ENDPOINT": hub.url, "TQDM_POSITION": "-1"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines()[0] == "ready" and json.loads(out.splitlines()[1])["revision"] == C2  # no bar on stdout
    assert len(out.splitlines()) == 2
    assert "model.onnx" in err and "100%" in err


def test_unknown_spec_lists_the_known_names(tmp_path):
    with pytest.raises(ModelUnavailableError) as info:
        resolve_model("no-such-model", tmp_path)
    for name in ["fast", "balanced", "quality", *model_hub.REGISTRY]:
        assert name in info.value.message
    with pytest.raises(ModelUnavailableError, match="does not exist"):
        resolve_model(str(tmp_path / "missing-folder"), tmp_path)


def test_local_bundle_folder_by_path(qint8, tmp_path):
    bundle = resolve_model(str(qint8), tmp_path)
    assert bundle.path == qint8.resolve() and bundle.sha256 == sha256(qint8 / "model.onnx")
    assert bundle.revision == f"sha256:{bundle.sha256[:16]}"
    assert not list(tmp_path.iterdir())  # nothing downloaded or written

"""The package's derived models (minilm-l6-tuned3, the fast tier for new databases, and minilm-l6-tuned2 and minilm-l6-tuned before it): deltas over the pinned built-in (models/delta.py, hub.py DERIVED)."""

from __future__ import annotations

import io
import lzma
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.errors import ModelUnavailableError
from tinycontext.models import hub
from tinycontext.models.checksum import file_sha256
from tinycontext.models.delta import apply_delta, make_delta
from tinycontext.models.embedder import Embedder
from tinycontext.models.hub import BUILTIN_SHA256, DELTA_FILE, DERIVED, builtin_bundle, resolve_model

NAME = "minilm-l6-tuned3"


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_the_delta_makes_the_pinned_model_once_into_models_dir(tmp_path, name):
    """Every model the package ships: the default and the earlier one that databases built with it keep."""
    bundle = resolve_model(name, tmp_path)
    assert bundle.model_file.is_relative_to(tmp_path) and file_sha256(bundle.model_file) == DERIVED[name].sha256
    assert (bundle.name, bundle.sha256) == (name, DERIVED[name].sha256) and bundle.sha256 != BUILTIN_SHA256
    assert [p.name for p in bundle.model_file.parent.iterdir()] == ["model.onnx"]  # no temp file left
    made = bundle.model_file.stat().st_mtime_ns
    assert resolve_model(name, tmp_path).model_file.stat().st_mtime_ns == made  # intact: reused, not made again
    bundle.model_file.write_bytes(b"truncated")
    assert file_sha256(resolve_model(name, tmp_path).model_file) == DERIVED[name].sha256  # damaged: made again
    # Its calibration is bound to that file, so documents go on its own outlier graph, not the float32 one.
    assert Embedder(bundle).identity["document_graph"].startswith("int8-outliers-")


def _package_with(monkeypatch, tmp_path, delta: bytes):
    """The package's minilm-l6-tuned3 folder, copied with ``delta`` in place of its own."""
    real = hub._package_folder
    folder = tmp_path / "package" / NAME
    shutil.copytree(real(NAME), folder)
    (folder / DELTA_FILE).write_bytes(delta)
    monkeypatch.setattr(hub, "_package_folder", lambda name: folder if name == NAME else real(name))
    return folder


def _other_weights(delta: bytes) -> bytes:
    """A well-formed delta that makes another model: one int8 step more in its first step tensor."""
    with np.load(io.BytesIO(lzma.decompress(delta))) as parts:
        stored = {key: parts[key] for key in parts.files}
    first = next(key for key in stored if key.startswith("step:"))
    stored[first] = stored[first].copy()
    stored[first].flat[0] += 1
    buffer = io.BytesIO()
    np.savez(buffer, **stored)
    return lzma.compress(buffer.getvalue())


@pytest.mark.parametrize("damage", ["flipped bytes", "other weights", "empty"])
def test_a_corrupt_delta_is_refused_and_writes_nothing(monkeypatch, tmp_path, damage):
    good = (hub._package_folder(NAME) / DELTA_FILE).read_bytes()
    delta = {"flipped bytes": good[:1000] + bytes(b ^ 0xFF for b in good[1000:1064]) + good[1064:],
             "other weights": _other_weights(good), "empty": b""}[damage]
    folder = _package_with(monkeypatch, tmp_path, delta)
    models = tmp_path / "models"
    with pytest.raises(ModelUnavailableError) as caught:
        resolve_model(NAME, models)
    message = caught.value.message
    assert str(folder / DELTA_FILE) in message and "Reinstall tinycontext" in message
    if damage == "other weights":
        assert f"expected {DERIVED[NAME].sha256[:16]}" in message
    else:
        assert "cannot be read" in message
    assert not models.exists() or not any(p.is_file() for p in models.rglob("*"))


def test_an_unwritable_models_dir_is_model_unavailable_with_the_way_out(tmp_path):
    models = tmp_path / "models"
    models.write_text("a file where the folder should be")
    with pytest.raises(ModelUnavailableError) as caught:
        resolve_model("fast", models)
    assert str(models) in caught.value.message and "models_dir" in caught.value.message and "minilm-l6-int8" in caught.value.message


def test_the_named_model_recalls_by_meaning(tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", models_dir=tmp_path / "models", embedding_model=NAME)
    memories = ["I adopted a puppy named Rex last spring", "The quarterly budget review moved to Thursday",
                "My sister moved to Lisbon for a job at a bank"]
    with MemoryEngine(config) as engine:
        engine.save([{"content": text} for text in memories])
        assert engine.embedder.identity["model"] == NAME
        top = engine.recall("what kind of dog do I have", dense_weight=1.0, top_k=1)["memories"]
        assert [m["content"] for m in top] == [memories[0]]
    # Its own vectors: close to the built-in's (a fine-tune of it), not the same.
    tuned = Embedder(resolve_model(NAME, tmp_path / "models"), cache_size=0).embed_documents(memories)
    builtin = Embedder(builtin_bundle(), cache_size=0).embed_documents(memories)
    cosines = (tuned * builtin).sum(axis=1)
    assert np.all(cosines < 0.999) and np.all(cosines > 0.5)


def _tiny_model(path, weight: np.ndarray, op: str = "MatMul"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    nodes = [helper.make_node("Cast", ["w_q"], ["w"], to=TensorProto.FLOAT), helper.make_node(op, ["x", "w"], ["y"])]
    inits = [numpy_helper.from_array(weight, "w_q"), numpy_helper.from_array(np.float32([0.5, 2.0]), "b")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits)), str(path))


def test_make_delta_round_trips_and_refuses_a_changed_graph(tmp_path):
    base, target, other = tmp_path / "base.onnx", tmp_path / "target.onnx", tmp_path / "other.onnx"
    _tiny_model(base, np.int8([[1, 2], [3, 127]]))
    _tiny_model(target, np.int8([[1, 2], [3, -127]]))  # a step of -254: stored as int16
    assert apply_delta(base, make_delta(base, target)) == target.read_bytes()
    _tiny_model(other, np.int8([[1, 2], [3, 4]]), op="Add")
    with pytest.raises(ValueError, match="more than initializer values"):
        make_delta(base, other)

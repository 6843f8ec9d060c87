"""A model shipped as the difference to the pinned built-in model: same graph, other weights.

A fine-tune of the built-in (scripts/finetune_minilm.py) keeps its graph and changes its weights; the
int8 weights move by a step or two in a small share of entries, so the difference compresses to a
tenth of the model file. A delta holds, per initializer that changed, either the int8 steps (new
minus base) or the new float tensor, as an lzma-compressed ``.npz``. Applying it rewrites the base
graph's initializers and serialises the model again: the bytes (and so the sha256) are exactly those
of the model the delta was made from, which the caller checks against a pinned value.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np

STEP = "step:"    # int8 initializer: new minus base, in int8 steps
VALUE = "value:"  # any other initializer: the new tensor


def _initializers(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def replace_initializers(model_file: Path, arrays: dict[str, np.ndarray]) -> bytes:
    """``model_file``'s model with the named initializers replaced by ``arrays`` (same shape and type), serialised."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_file))
    by_name = {init.name: init for init in model.graph.initializer}
    for name, array in arrays.items():
        old = by_name.get(name)
        if old is None:
            raise ValueError(f"{model_file} has no initializer {name!r}")
        new = numpy_helper.from_array(array, name)
        if tuple(new.dims) != tuple(old.dims) or new.data_type != old.data_type:
            raise ValueError(f"{name}: {tuple(new.dims)} type {new.data_type} does not replace {tuple(old.dims)} type {old.data_type}")
        old.CopyFrom(new)
    return model.SerializeToString()


def make_delta(base_file: Path, target_file: Path) -> bytes:
    """The delta turning ``base_file`` into ``target_file``; refused unless applying it gives the target's exact bytes
    (the two models must differ in initializer values only)."""
    import onnx

    base, target = _initializers(onnx.load(str(base_file))), _initializers(onnx.load(str(target_file)))
    if set(base) != set(target):
        raise ValueError(f"{target_file} and {base_file} have different initializers: {sorted(set(base) ^ set(target))[:5]}")
    parts: dict[str, np.ndarray] = {}
    for name, new in target.items():
        old = base[name]
        if new.dtype != old.dtype or new.shape != old.shape:
            raise ValueError(f"{name}: {new.dtype}{new.shape} in {target_file}, {old.dtype}{old.shape} in {base_file}")
        if np.array_equal(new, old):
            continue
        if new.dtype == np.int8:
            step = new.astype(np.int16) - old.astype(np.int16)
            fits = np.abs(step).max() <= 127
            parts[STEP + name] = step.astype(np.int8) if fits else step
        else:
            parts[VALUE + name] = new
    buffer = io.BytesIO()
    np.savez(buffer, **parts)
    delta = lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    if apply_delta(base_file, delta) != Path(target_file).read_bytes():
        raise ValueError(f"{target_file} differs from {base_file} in more than initializer values: no delta reproduces it")
    return delta


def apply_delta(base_file: Path, delta: bytes) -> bytes:
    """The model made from ``base_file`` and ``delta`` (make_delta's), serialised. Raises ValueError on a delta that
    cannot be read or does not fit the base."""
    import onnx

    try:
        with np.load(io.BytesIO(lzma.decompress(delta)), allow_pickle=False) as parts:
            stored = {key: parts[key] for key in parts.files}
    except Exception as exc:  # lzma, zip and npy errors share no type
        raise ValueError(f"the delta cannot be read ({type(exc).__name__}: {exc})") from exc
    base = _initializers(onnx.load(str(base_file)))
    arrays: dict[str, np.ndarray] = {}
    for key, value in stored.items():
        kind, _, name = key.partition(":")
        if name not in base:
            raise ValueError(f"the delta names {name!r}, which the base model does not have")
        if kind + ":" == STEP:
            if value.shape != base[name].shape or base[name].dtype != np.int8:
                raise ValueError(f"the delta's steps for {name!r} do not fit the base tensor")
            arrays[name] = (base[name].astype(np.int16) + value).astype(np.int8)
        elif kind + ":" == VALUE:
            arrays[name] = value
        else:
            raise ValueError(f"the delta has an entry {key!r} of unknown kind")
    return replace_initializers(base_file, arrays)

"""Calibrate the outlier channels of the int8 document graph (tinycontext/models/int8_graph.py) for a
model bundle, on tuning text only: SciFact train queries and the LoCoMo dev turns.

For each int8 MatMul input that may carry outliers (``outlier_inputs``: LayerNorm outputs, the FFN
activation), the float32 graph runs every calibration text alone (no padding) and keeps each
channel's largest |x| over all tokens; the ``--channels`` largest channels are the outliers. The
result goes next to the bundle's model_config.json as int8_outliers.json, bound to the model file's
sha256 (models/embedder.py ignores a file made for another model file). A new calibration renames the
graph (its channels' digest is in the name), so a database made on the old one is never taken for the new
one's: it needs `tinycontext reindex`.

    python scripts/calibrate_int8_outliers.py                  # the built-in model, into tinycontext/data
    python scripts/calibrate_int8_outliers.py --bundle DIR     # a bundle folder (e.g. scripts/finetune_minilm.py's)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine  # noqa: E402
import bench_locomo  # noqa: E402
from tinycontext.models.checksum import file_sha256  # noqa: E402
from tinycontext.models.embedder import OUTLIERS_FILE, _load_tokenizer  # noqa: E402
from tinycontext.models.hub import builtin_bundle, local_bundle  # noqa: E402
from tinycontext.models.int8_graph import outlier_inputs  # noqa: E402


def texts() -> list[str]:
    _, queries, _ = bench_engine.load_scifact("train")
    turns = [text for conv in bench_locomo.load() for chat in bench_locomo.sessions(conv, "plain") for _, text in chat]
    return list(queries.values()) + turns


def channel_max(bundle, inputs: list[str], calibration: list[str]) -> dict[str, np.ndarray]:
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(bundle.model_file))
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    tokenizer, _ = _load_tokenizer(bundle)
    feeds = {i.name for i in session.get_inputs()}
    largest: dict[str, np.ndarray] = {}
    for text in calibration:
        ids = np.array([tokenizer.encode(text).ids], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        outputs = dict(zip(names, session.run(None, {k: v for k, v in feed.items() if k in feeds})))
        for name in inputs:
            seen = np.abs(outputs[name]).reshape(-1, outputs[name].shape[-1]).max(axis=0)
            largest[name] = np.maximum(largest.get(name, seen), seen)
    return largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--channels", type=int, default=4, help="outlier channels per input")
    parser.add_argument("--bundle", type=Path, help="a bundle folder to calibrate (default: the built-in model)")
    args = parser.parse_args()
    bundle = local_bundle(args.bundle) if args.bundle else builtin_bundle()
    inputs = outlier_inputs(bundle.model_file)
    calibration = texts()
    largest = channel_max(bundle, inputs, calibration)
    channels = {name: sorted(int(c) for c in np.argsort(-largest[name])[:args.channels]) for name in inputs}
    out = {
        "model_sha256": bundle.sha256 or file_sha256(bundle.model_file),
        "calibration": f"{len(calibration)} texts: SciFact train queries and LoCoMo dev turns; the {args.channels} "
                       "channels of largest |x| per input (scripts/calibrate_int8_outliers.py)",
        "channels": channels,
        "ratio_to_median": {name: round(float(largest[name][channels[name]].min() / np.median(largest[name])), 2) for name in inputs},
    }
    path = bundle.path / OUTLIERS_FILE
    tmp = path.with_suffix(".tmp")  # atomic: a reader never sees half a file
    tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"{path}: {len(inputs)} inputs from {len(calibration)} texts")


if __name__ == "__main__":
    main()

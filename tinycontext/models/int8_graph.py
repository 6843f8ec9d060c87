"""An ONNX graph with int8 weights rewritten to compute in int8 (used for queries, models/embedder.py).

A model whose weights are stored as int8 and dequantised in the graph (``Cast(w_q) * scale``, one
scale per output column or per tensor, as in the built-in model) runs each MatMul in float32 after
onnxruntime folds the weights back to float32. Rewritten, each such MatMul quantises its input to
uint8 and multiplies by the int8 weights as stored (``MatMulInteger``: u8 x s8, VNNI on x86),
then scales the int32 result back to float32.

Each token's activations get their own scale (symmetric, ``max|x| / 127`` over that token's row,
zero point 128), so a token's result depends on that token alone: a text's vector is the same
alone or in any batch, and on any thread count (integer sums are exact). onnxruntime's dynamic
quantisation takes one scale for the whole batch instead, which makes vectors depend on the batch.
With ``per_text``, that is the rewrite (``DynamicQuantizeLinear``, which onnxruntime fuses with the
integer product into one kernel: a short query runs ~19 % faster): it is for one text per run, whose
vector then depends on that text alone (the embedder runs its queries so; notes/bench_scale.md). One
scale over a whole text is coarser than one per token, so there the outlier channels (below) are kept
in float32 where a single MatMul reads the activation (the FFN's two products: one small float32
product each); the inputs of Q, K and V (three products each) are quantised whole.
Embedding tables dequantised the same way are gathered as int8 and dequantised per looked-up row,
so they are not held as float32.

With ``outliers`` (calibrated per model: scripts/calibrate_int8_outliers.py), a few channels of a
MatMul's input that carry most of its range (LayerNorm outputs and the FFN activation of a BERT
have a handful, LLM.int8()-style) stay float32: they are zeroed before the per-token quantisation,
so the other channels keep a fine scale, and multiplied in float32 by their weight rows (``Gemm``
adding the int8 product). The document vectors' error to float32 drops 7-11x at int8 speed
(notes/bench_scale.md).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

# Version of the rewrite below: part of a vector's recipe (Embedder.recipe). The fused operators
# (QuantizeLinear / DequantizeLinear per row, no NaN guard) make the same vectors as version 1's
# Div / Round / Cast chain, bit for bit, so the version stays.
REWRITE_VERSION = 1


# The producers of the MatMul inputs that may hold outlier channels: the LayerNorm before Q/K/V and the
# FFN, and the FFN's activation (Mul, the end of GELU); not the attention context (a Reshape).
OUTLIER_PRODUCERS = ("LayerNormalization", "Mul")


class _Weights:
    """Where a graph's int8 weights are: ``dequantised(name)`` gives (int8 initializer, scale
    initializer) when ``name`` is ``Cast(int8) * scale``."""

    def __init__(self, graph):
        from onnx import TensorProto

        self.producer = {out: node for node in graph.node for out in node.output}
        self.shapes = {init.name: tuple(init.dims) for init in graph.initializer}
        self._int8 = {init.name for init in graph.initializer if init.data_type == TensorProto.INT8}

    def dequantised(self, name: str) -> tuple[str, str] | None:
        mul = self.producer.get(name)
        if mul is None or mul.op_type != "Mul":
            return None
        cast = self.producer.get(mul.input[0])
        if cast is None or cast.op_type != "Cast" or cast.input[0] not in self._int8 or mul.input[1] not in self.shapes:
            return None
        return cast.input[0], mul.input[1]

    def matmul(self, node) -> tuple[str, str] | None:
        """A MatMul's int8 weight and scale when the rewrite converts it (a scale per column or per tensor
        factors out of the sum over rows)."""
        weight = self.dequantised(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(self.shapes[weight[0]]) != 2:
            return None
        return weight if self.shapes[weight[1]] in ((), (1,), (1, self.shapes[weight[0]][1])) else None


def outlier_inputs(model_file: Path) -> list[str]:
    """The converted MatMuls' inputs that may carry outlier channels (what a calibration measures)."""
    import onnx

    graph = onnx.load(str(model_file)).graph
    weights = _Weights(graph)
    found: list[str] = []
    for node in graph.node:
        x = node.input[0] if node.input else ""
        producer = weights.producer.get(x)
        if weights.matmul(node) and producer is not None and producer.op_type in OUTLIER_PRODUCERS and x not in found:
            found.append(x)
    return found


def _split_outliers(added: dict[str, np.ndarray], p: str, x: str, rows: int, channels: list[int]):
    """The outlier ``channels`` taken out of activation ``x`` of ``rows`` channels (zeroed, so they set no scale):
    the node making ``p``_in, the int8 part's source; the constants ``p``_keep and ``p``_channels (the channels
    to pick out as float32) are added."""
    from onnx import helper

    keep = np.ones(rows, np.float32)
    keep[channels] = 0
    added[p + "_keep"], added[p + "_channels"] = keep, np.array(channels, np.int64)
    return helper.make_node("Mul", [x, p + "_keep"], [p + "_in"])


def _outlier_rows(arrays, w_q: str, w_scale: str, channels: list[int]) -> np.ndarray:
    """The weight rows of the outlier channels in float32, as dequantised in the original graph."""
    from onnx import numpy_helper

    rows = numpy_helper.to_array(arrays[w_q])[channels].astype(np.float32)
    return rows * numpy_helper.to_array(arrays[w_scale]).astype(np.float32)


def int8_compute_graph(model_file: Path, outliers: dict[str, list[int]] | None = None, *, per_text: bool = False) -> bytes | None:
    """The rewritten model, serialised; None when no MatMul reads int8 weights (nothing to gain).
    ``outliers``: per MatMul input name, the channels kept in float32. ``per_text``: one activation
    scale per run instead of per token, for runs of one text (outliers only where one MatMul reads them)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    outliers = outliers or {}
    model = onnx.load(str(model_file))
    graph = model.graph
    weights = _Weights(graph)
    shapes = weights.shapes
    arrays = {init.name: init for init in graph.initializer}
    readers = Counter(node.input[0] for node in graph.node if weights.matmul(node))
    added: dict[str, np.ndarray] = {
        "int8q_127": np.array(127, np.float32),
        "int8q_tiny": np.array(127e-12, np.float32),  # the max of an all-zero row
        "int8q_zp": np.array(128, np.uint8),
        "int8q_zp1": np.array([128], np.uint8),
        "int8q_flat": np.array([-1], np.int64),
        "int8q_0": np.array([0], np.int64),
        "int8q_-1": np.array([-1], np.int64),
    }

    nodes, quantised, converted, nan_checks = [], {}, 0, {}
    for node in graph.node:
        if node.op_type == "IsNaN":
            nan_checks[node.output[0]] = node.input[0]
        if node.op_type == "Where" and nan_checks.get(node.input[0]) == node.input[2]:
            # Where(IsNaN(softmax), 0, softmax) guards rows with every key masked; every row has a
            # real token (the tokenizer's [CLS]), so it is the identity.
            nodes.append(helper.make_node("Identity", [node.input[2]], [node.output[0]]))
            continue
        weight = weights.matmul(node)
        if weight:
            w_q, w_scale = weight
            rows, cols = shapes[w_q]
            x, out = node.input[0], node.output[0]
            channels = outliers.get(x)
            if per_text:
                channels = channels if readers[x] == 1 else None
                p = f"{x}__u8"
                if x not in quantised:  # asymmetric uint8, its scale and zero point from the run's min and max
                    quantised[x] = source = x
                    if channels:  # the outlier channels out of the int8 part, kept as float32 rows
                        source = p + "_in"
                        nodes += [_split_outliers(added, p, x, rows, channels),
                                  helper.make_node("Gather", [x, p + "_channels"], [p + "_outliers"], axis=-1)]
                    nodes.append(helper.make_node("DynamicQuantizeLinear", [source], [p, p + "_scale", p + "_zp"]))
                product = out if not channels else out + "__int8"
                nodes += [
                    helper.make_node("MatMulInteger", [p, w_q, p + "_zp"], [out + "__i32"]),
                    helper.make_node("Cast", [out + "__i32"], [out + "__f32"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", [p + "_scale", w_scale], [out + "__scale"]),
                    helper.make_node("Mul", [out + "__f32", out + "__scale"], [product]),
                ]
                if channels:
                    added[out + "__outlier_rows"] = _outlier_rows(arrays, w_q, w_scale, channels)
                    nodes += [helper.make_node("MatMul", [p + "_outliers", out + "__outlier_rows"], [out + "__outlier"]),
                              helper.make_node("Add", [product, out + "__outlier"], [out])]
                converted += 1
                continue
            added[f"int8q_rows{rows}"] = np.array([-1, rows], np.int64)
            added[f"int8q_cols{cols}"] = np.array([cols], np.int64)
            if x not in quantised:  # one quantisation per activation, shared by the MatMuls reading it (Q, K, V)
                p = f"{x}__u8"
                source = x
                if channels:
                    # The outlier channels out of the int8 part, and as float32 rows.
                    source = p + "_in"
                    nodes += [
                        _split_outliers(added, p, x, rows, channels),
                        helper.make_node("Reshape", [x, f"int8q_rows{rows}"], [p + "_x2d"]),
                        helper.make_node("Gather", [p + "_x2d", p + "_channels"], [p + "_outliers"], axis=1),
                    ]
                nodes += [
                    # Per token (row): scale max|x| / 127, zero point 128; as 2-D rows for the per-axis ops.
                    helper.make_node("ReduceMax", [source], [p + "_hi"], axes=[-1], keepdims=1),
                    helper.make_node("ReduceMin", [source], [p + "_lo"], axes=[-1], keepdims=1),
                    helper.make_node("Neg", [p + "_lo"], [p + "_neg"]),
                    helper.make_node("Max", [p + "_hi", p + "_neg", "int8q_tiny"], [p + "_max"]),
                    helper.make_node("Div", [p + "_max", "int8q_127"], [p + "_scale3"]),
                    helper.make_node("Reshape", [p + "_scale3", "int8q_flat"], [p + "_scale"]),
                    helper.make_node("Shape", [p + "_scale"], [p + "_count"]),
                    helper.make_node("Expand", ["int8q_zp1", p + "_count"], [p + "_zp"]),
                    helper.make_node("Reshape", [source, f"int8q_rows{rows}"], [p + "_2d"]),
                    helper.make_node("QuantizeLinear", [p + "_2d", p + "_scale", p + "_zp"], [p], axis=0),
                    helper.make_node("Shape", [x], [p + "_shape"]),
                    helper.make_node("Slice", [p + "_shape", "int8q_0", "int8q_-1"], [p + "_lead"]),
                ]
                quantised[x] = p
            p = quantised[x]
            nodes += [
                helper.make_node("MatMulInteger", [p, w_q, "int8q_zp"], [out + "__i32"]),
                helper.make_node("DequantizeLinear", [out + "__i32", p + "_scale"], [out + "__row"], axis=0),
                helper.make_node("Mul", [out + "__row", w_scale], [out + "__2d"]),
            ]
            product = out + "__2d"
            if channels:
                # Their float32 weight rows (as dequantised in the original graph), added to the int8 product.
                added[out + "__outlier_rows"] = _outlier_rows(arrays, w_q, w_scale, channels)
                nodes.append(helper.make_node("Gemm", [p + "_outliers", out + "__outlier_rows", product], [out + "__sum"]))
                product = out + "__sum"
            nodes += [
                helper.make_node("Concat", [p + "_lead", f"int8q_cols{cols}"], [out + "__shape"], axis=0),
                helper.make_node("Reshape", [product, out + "__shape"], [out]),
            ]
            converted += 1
        elif node.op_type == "Gather" and len(node.input) == 2 and (table := weights.dequantised(node.input[1])) \
                and shapes[table[1]] in ((), (1,), (shapes[table[0]][0], 1)):
            (w_q, w_scale), ids, out = table, node.input[1], node.output[0]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if axis != 0:
                nodes.append(node)
                continue
            per_row = len(shapes[w_scale]) == 2
            nodes += [
                helper.make_node("Gather", [w_q, ids], [out + "__q"], axis=0),
                helper.make_node("Cast", [out + "__q"], [out + "__f32"], to=TensorProto.FLOAT),
                *([helper.make_node("Gather", [w_scale, ids], [out + "__scale"], axis=0)] if per_row else []),
                helper.make_node("Mul", [out + "__f32", out + "__scale" if per_row else w_scale], [out]),
            ]
        else:
            nodes.append(node)
    if not converted:
        return None
    # Drop what nothing reads any more: the float32 copies of the converted weights.
    outputs = {o.name for o in graph.output}
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        kept = [node for node in nodes if any(out in read for out in node.output)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in added.items() if name in read)
    return model.SerializeToString()

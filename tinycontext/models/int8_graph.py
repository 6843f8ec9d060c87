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
Embedding tables dequantised the same way are gathered as int8 and dequantised per looked-up row,
so they are not held as float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Version of the rewrite below: part of a vector's recipe (Embedder.recipe). The fused operators
# (QuantizeLinear / DequantizeLinear per row, no NaN guard) make the same vectors as version 1's
# Div / Round / Cast chain, bit for bit, so the version stays.
REWRITE_VERSION = 1


def int8_compute_graph(model_file: Path) -> bytes | None:
    """The rewritten model, serialised; None when no MatMul reads int8 weights (nothing to gain)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(model_file))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    types = {init.name: init.data_type for init in graph.initializer}
    added: dict[str, np.ndarray] = {
        "int8q_127": np.array(127, np.float32),
        "int8q_tiny": np.array(127e-12, np.float32),  # the max of an all-zero row
        "int8q_zp": np.array(128, np.uint8),
        "int8q_zp1": np.array([128], np.uint8),
        "int8q_flat": np.array([-1], np.int64),
        "int8q_0": np.array([0], np.int64),
        "int8q_-1": np.array([-1], np.int64),
    }

    def dequantised(name: str) -> tuple[str, str] | None:
        """(int8 initializer, scale initializer) when ``name`` is ``Cast(int8) * scale``."""
        mul = producer.get(name)
        if mul is None or mul.op_type != "Mul":
            return None
        cast = producer.get(mul.input[0])
        if cast is None or cast.op_type != "Cast" or types.get(cast.input[0]) != TensorProto.INT8 or mul.input[1] not in shapes:
            return None
        return cast.input[0], mul.input[1]

    nodes, quantised, converted, nan_checks = [], {}, 0, {}
    for node in graph.node:
        if node.op_type == "IsNaN":
            nan_checks[node.output[0]] = node.input[0]
        if node.op_type == "Where" and nan_checks.get(node.input[0]) == node.input[2]:
            # Where(IsNaN(softmax), 0, softmax) guards rows with every key masked; every row has a
            # real token (the tokenizer's [CLS]), so it is the identity.
            nodes.append(helper.make_node("Identity", [node.input[2]], [node.output[0]]))
            continue
        weight = dequantised(node.input[1]) if node.op_type in ("MatMul", "Gather") and len(node.input) == 2 else None
        if node.op_type == "MatMul" and weight and len(shapes[weight[0]]) == 2:
            w_q, w_scale = weight
            rows, cols = shapes[w_q]
            if shapes[w_scale] not in ((), (1,), (1, cols)):  # the scale must factor out of the sum over rows
                nodes.append(node)
                continue
            x, out = node.input[0], node.output[0]
            added[f"int8q_rows{rows}"] = np.array([-1, rows], np.int64)
            added[f"int8q_cols{cols}"] = np.array([cols], np.int64)
            if x not in quantised:  # one quantisation per activation, shared by the MatMuls reading it (Q, K, V)
                p = f"{x}__u8"
                nodes += [
                    # Per token (row): scale max|x| / 127, zero point 128; as 2-D rows for the per-axis ops.
                    helper.make_node("ReduceMax", [x], [p + "_hi"], axes=[-1], keepdims=1),
                    helper.make_node("ReduceMin", [x], [p + "_lo"], axes=[-1], keepdims=1),
                    helper.make_node("Neg", [p + "_lo"], [p + "_neg"]),
                    helper.make_node("Max", [p + "_hi", p + "_neg", "int8q_tiny"], [p + "_max"]),
                    helper.make_node("Div", [p + "_max", "int8q_127"], [p + "_scale3"]),
                    helper.make_node("Reshape", [p + "_scale3", "int8q_flat"], [p + "_scale"]),
                    helper.make_node("Shape", [p + "_scale"], [p + "_count"]),
                    helper.make_node("Expand", ["int8q_zp1", p + "_count"], [p + "_zp"]),
                    helper.make_node("Reshape", [x, f"int8q_rows{rows}"], [p + "_2d"]),
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
                helper.make_node("Concat", [p + "_lead", f"int8q_cols{cols}"], [out + "__shape"], axis=0),
                helper.make_node("Reshape", [out + "__2d", out + "__shape"], [out]),
            ]
            converted += 1
        elif node.op_type == "Gather" and weight and shapes[weight[1]] in ((), (1,), (shapes[weight[0]][0], 1)):
            (w_q, w_scale), ids, out = weight, node.input[1], node.output[0]
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
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in added.items())
    return model.SerializeToString()

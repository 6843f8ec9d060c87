"""LoCoMo ingest + ranking with the published TinyContext 0.5.1 (tinysuite-context==0.5.1).

Run with that package's own venv (it needs Python >= 3.12), not the project's:
    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/bench-venv-0.5.1
    /work/bench-venv-0.5.1/bin/pip install tinysuite-context==0.5.1 onnx pysqlite3-binary
    HF_HUB_OFFLINE=1 TIKTOKEN_CACHE_DIR=../shared/tiktoken/cache \
        /work/bench-venv-0.5.1/bin/python scripts/bench_baseline_tinycontext05.py --out /tmp/base.json

TIKTOKEN_CACHE_DIR matters: offline, 0.5.1 cannot fetch o200k_base and silently falls back to
counting characters as tokens, so its 2,000-token recall budget becomes 2,000 characters.

Offline model: 0.5.1's "fast" tier downloads onnx-models/all-MiniLM-L6-v2-onnx, whose graph has
Transformer + mean Pooling + Normalize inside (a 2-D output that 0.5.1 uses as is). We cannot reach
the hub, so we build the equivalent from the shared int8 MiniLM bundle (the same weights as our built-in
minilm-l6-int8, the `fast` tier before minilm-l6-tuned): its graph plus masked-mean pooling and L2 normalisation, output `sentence_embedding`,
placed where 0.5.1 looks for it (<models_dir>/all-minilm-l6-v2-onnx/). Without the pooled output
0.5.1 would fall back to the CLS token of last_hidden_state, which MiniLM was not trained for.

Writes JSON: per-conversation ingest time, saved/skipped counts, and qrels + run rows (ranked ids)
that bench_engine.py scores with the same ir-measures code as our engine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import bench_locomo

# pyenv's Python here is built without loadable SQLite extensions, so 0.5.1 would fall back to scoring
# every stored vector in Python; a user's usual Python loads its sqlite-vec natively. pysqlite3 (the
# SQLite library with extension loading) stands in for that sqlite3 before 0.5.1 imports it.
try:
    import pysqlite3.dbapi2

    sys.modules["sqlite3"] = pysqlite3.dbapi2
except ImportError:
    pass
import sqlite3  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
BUNDLE = SHARED / "models" / "minilm-l6-int8"
PRESET_DIR = "all-minilm-l6-v2-onnx"  # 0.5.1's local folder name for its "fast" preset


def build_pooled_bundle(models_dir: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    target = models_dir / PRESET_DIR
    if (target / "model.onnx").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(BUNDLE / "model.onnx"))
    g = model.graph
    hidden = g.output[0].name  # last_hidden_state [batch, seq, 384]
    g.initializer.extend([
        helper.make_tensor("pool_axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("pool_axis_last", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("pool_eps", TensorProto.FLOAT, [], [1e-9]),
    ])
    g.node.extend([
        helper.make_node("Cast", ["attention_mask"], ["pool_mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pool_mask_f", "pool_axis_last"], ["pool_mask"]),
        helper.make_node("Mul", [hidden, "pool_mask"], ["pool_masked"]),
        helper.make_node("ReduceSum", ["pool_masked", "pool_axis1"], ["pool_sum"], keepdims=0),
        helper.make_node("ReduceSum", ["pool_mask", "pool_axis1"], ["pool_count_raw"], keepdims=0),
        helper.make_node("Max", ["pool_count_raw", "pool_eps"], ["pool_count"]),
        helper.make_node("Div", ["pool_sum", "pool_count"], ["pool_mean"]),
        helper.make_node("LpNormalization", ["pool_mean"], ["sentence_embedding"], axis=1, p=2),
    ])
    g.output.append(helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 384]))
    onnx.save(model, str(target / "model.onnx"))
    shutil.copy2(BUNDLE / "tokenizer.json", target / "tokenizer.json")
    return target


def _ids_in_order(db_path: Path, ids: list[str]) -> dict[str, str]:
    with sqlite3.connect(db_path) as conn:
        marks = ",".join("?" * len(ids))
        return dict(conn.execute(f"SELECT id, content FROM memories WHERE id IN ({marks})", ids).fetchall()) if ids else {}


def run(args) -> dict:
    from tinycontext import MemoryInput, recall_memories, save_memories

    models_dir = Path(args.models_dir)
    build_pooled_bundle(models_dir)
    work = Path(tempfile.mkdtemp(prefix="tc051-"))
    convs = bench_locomo.load()[: 1 if args.quick else None]
    out = {"conversations": {}, "qrels": [], "run": [], "returned_tokens": {}}
    for conv in convs:
        sid = conv["sample_id"]
        config = {"memory_db_path": str(work / f"{sid}.db"), "embedding_model": "fast", "models_dir": str(models_dir)}
        save_memories([MemoryInput(content="warm-up")], session_id="warmup", config=config)  # load model outside timing
        dia_to_id: dict[str, str] = {}
        elapsed = saved_n = dropped = 0
        for chat in bench_locomo.sessions(conv, args.format):
            started = time.perf_counter()
            result = save_memories([MemoryInput(content=text) for _, text in chat], session_id=sid, config=config)
            elapsed += time.perf_counter() - started
            # 0.5.1 reports saved and skipped items in two lists without indices; both keep input
            # order, so walk the inputs and match saved contents to recover which turn was dropped.
            saved, skipped = result["saved"], result.get("skipped_duplicates", [])
            contents = _ids_in_order(Path(config["memory_db_path"]), [s["id"] for s in saved])
            si = ki = 0
            for dia, text in chat:
                if si < len(saved) and contents.get(saved[si]["id"]) == text.strip():
                    dia_to_id[dia] = saved[si]["id"]
                    si += 1
                else:
                    ref = skipped[ki]["duplicate_of"]
                    ki += 1
                    full = [v for v in dia_to_id.values() if v.startswith(ref)]
                    dia_to_id[dia] = full[0] if full else f"dropped:{ref}"
            saved_n += len(saved)
            dropped += len(skipped)
        out["conversations"][sid] = {"turns": sum(len(c) for c in bench_locomo.sessions(conv)), "saved": saved_n,
                                     "dropped_near_duplicates": dropped, "ingest_s": elapsed}
        out["qrels"] += bench_locomo.qrels_for(conv, dia_to_id)
        for q in bench_locomo.questions(conv):
            result = recall_memories(q["question"], session_id=sid, top_k=args.top_k, config=config)
            out["run"] += [(q["qid"], m["id"], rank) for rank, m in enumerate(result["memories"], start=1)]
            out["returned_tokens"][q["qid"]] = sum(m.get("content_tokens", m.get("tokens", 0)) for m in result["memories"])
    shutil.rmtree(work, ignore_errors=True)
    return out


def native_vec() -> bool:
    """Whether 0.5.1 searches with sqlite-vec itself (else its Python fallback scores every vector)."""
    from tinycontext.services.memory_store_service import _load_sqlite_vec

    return _load_sqlite_vec(sqlite3.connect(":memory:"))


def latency(args) -> dict:
    """Recall p50/p95 of 0.5.1 over the memories in ``--latency`` (a JSON file written by bench_release.py
    or bench_scale_suite.py: sessions of texts with their vectors, the same rows our engine is timed on,
    warm-up questions and fresh timed ones). Rows go in through 0.5.1's own insert_memories with the
    vectors given (embedding them with 0.5.1 would take an hour); queries go through recall_memories
    with its defaults, which embeds each one."""
    import numpy as np
    from tinycontext import MemoryInput, recall_memories, save_memories
    from tinycontext.models import MemoryRow
    from tinycontext.services.memory_store_service import insert_memories

    spec = json.loads(Path(args.latency).read_text())
    vectors = np.load(spec["vectors"])
    models_dir = Path(args.models_dir)
    build_pooled_bundle(models_dir)
    work = Path(tempfile.mkdtemp(prefix="tc051-lat-"))
    db = work / "latency.db"
    config = {"memory_db_path": str(db), "embedding_model": "fast", "models_dir": str(models_dir)}
    save_memories([MemoryInput(content="warm-up")], session_id="warmup", config=config)
    with sqlite3.connect(db) as conn:
        model_key = conn.execute("SELECT embedding_model FROM memories LIMIT 1").fetchone()[0]
    stamp = "2026-01-01T00:00:00+00:00"
    row = 0
    for session, texts in spec["sessions"].items():
        for start in range(0, len(texts), 5000):
            chunk = texts[start:start + 5000]
            insert_memories(db, [MemoryRow(id=str(uuid.uuid4()), session_id=session, content=t, created_at=stamp,
                                           embedding=vectors[row + i].tolist(), embedding_model=model_key, embedding_dimensions=vectors.shape[1])
                                 for i, t in enumerate(chunk)])
            row += len(chunk)
    for q in spec["warmups"]:
        recall_memories(q, session_id=spec["session"], config=config)
    ms, cpu = [], []
    for q in spec["queries"]:
        started, started_cpu = time.perf_counter(), time.process_time()
        recall_memories(q, session_id=spec["session"], config=config)
        ms.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    shutil.rmtree(work, ignore_errors=True)
    return {"memories": row, "session": spec["session"], "warmups": len(spec["warmups"]), "queries": len(ms), "native_sqlite_vec": native_vec(),
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "cpu_p50_ms": float(np.percentile(cpu, 50)), "cpu_p95_ms": float(np.percentile(cpu, 95))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models-dir", default="/work/bench-models-0.5.1")
    parser.add_argument("--format", choices=bench_locomo.FORMATS, default="plain")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="first conversation only")
    parser.add_argument("--latency", help="time recall over the memories this JSON file lists instead (bench_release.py)")
    args = parser.parse_args()
    Path(args.out).write_text(json.dumps(latency(args) if args.latency else run(args)), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

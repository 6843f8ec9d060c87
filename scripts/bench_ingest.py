"""Agent-sized saves (issue 25 item 3): LoCoMo turns saved 20 a call into fresh sessions, against plain
fp32 onnxruntime embedding the same calls, in the same run.

    python scripts/bench_ingest.py                       # 2 rounds over the first --turns turns
    python scripts/bench_ingest.py --turns 800 --rounds 1 --profile   # the save path under cProfile

Ours: ``MemoryEngine.save`` with default settings (built-in model, dedup on, documents on the int8 graph
with the calibrated outlier channels in float32), again with ``embedding_outlier_documents`` off (documents
on the float32 graph) and with ``embedding_int8_documents`` on (the plain int8 graph), a fresh database
per round, one warm-up save before timing, each LoCoMo conversation into its own new session, its turns
("Speaker: text", in order) in calls of ``--per-call``. The baselines embed exactly the same calls and
store nothing: the fp32 MiniLM from ../shared in an ``onnxruntime.InferenceSession`` with default
options (ORT's own intra-op threads), batches of at most 32 in the call's order, mean pooling,
normalised; ``pad128`` uses the bundle's tokenizer as shipped (it pads and truncates every input to
128), ``longest`` pads each batch to its longest input and truncates at 256 as the model card says.
Rounds alternate baseline and ours, so drifting load hits both; the ratio is per round.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_locomo  # noqa: E402
from tinycontext import MemoryEngine, TinyContextConfig  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FP32 = SHARED / "models" / "minilm-l6-fp32"


def calls(turns: int, per_call: int) -> list[tuple[str, list[str]]]:
    """(session, texts) per save call: each conversation's turns in order, ``per_call`` at a time."""
    out: list[tuple[str, list[str]]] = []
    left = turns
    for conv in bench_locomo.load():
        texts = [t for chat in bench_locomo.sessions(conv, "plain") for _, t in chat][:left]
        out += [(conv["sample_id"], texts[i:i + per_call]) for i in range(0, len(texts), per_call)]
        left -= len(texts)
        if left <= 0:
            break
    return out


class PlainOrt:
    """What a user of onnxruntime writes: one session with default options, batches of 32, mean pooling."""

    def __init__(self, padding: str):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.session = ort.InferenceSession(str(FP32 / "model.onnx"), providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(FP32 / "tokenizer.json"))
        if padding == "longest":
            self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            self.tokenizer.enable_truncation(256)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), 32):
            enc = self.tokenizer.encode_batch(texts[i:i + 32])
            ids = np.array([e.ids for e in enc], np.int64)
            mask = np.array([e.attention_mask for e in enc], np.int64)
            hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
            pooled = (hidden * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
            out.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        return np.concatenate(out)


def run_baseline(work: list[tuple[str, list[str]]], padding: str) -> dict:
    model = PlainOrt(padding)
    model.embed(["warm-up"])
    t, c = time.perf_counter(), time.process_time()
    for _, texts in work:
        model.embed(texts)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    n = sum(len(texts) for _, texts in work)
    return {"turns": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "turns_per_s": round(n / wall, 1)}


def run_ours(work: list[tuple[str, list[str]]], root: Path, profile: bool, **settings) -> dict:
    db = root / f"ingest-{time.monotonic_ns()}.db"
    config = TinyContextConfig(memory_db_path=db, models_dir=root / "models", **settings)
    with MemoryEngine(config) as engine:
        engine.save(["warm-up"], session_id="warm-up")  # loads the model and binds it before timing
        profiler = cProfile.Profile() if profile else None
        saved = 0
        t, c = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        for session, texts in work:
            saved += len(engine.save(texts, session_id=f"fresh-{session}")["ids"])
        if profiler:
            profiler.disable()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        stored = engine.store.read("SELECT count(*) FROM memories WHERE session_id != 'warm-up'")[0][0]
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    n = sum(len(texts) for _, texts in work)
    return {"turns": n, "saved": saved, "stored": stored, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "turns_per_s": round(n / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--per-call", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="cProfile our saves (only ours runs)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = calls(args.turns, args.per_call)
    root = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    result: dict = {"command": " ".join(sys.argv), "calls": len(work), "per_call": args.per_call,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_start": os.getloadavg(), "rounds": []}
    try:
        for _ in range(args.rounds):
            if args.profile:
                result["rounds"].append({"ours": run_ours(work, root, True)})
                continue
            row = {"ort_pad128": run_baseline(work, "pad128"), "ort_longest": run_baseline(work, "longest"), "ours": run_ours(work, root, False),
                   "ours_float32_documents": run_ours(work, root, False, embedding_outlier_documents=False),
                   "ours_int8_documents": run_ours(work, root, False, embedding_int8_documents=True)}
            for name in ("ort_pad128", "ort_longest"):
                row[f"ratio_vs_{name}"] = round(row["ours"]["turns_per_s"] / row[name]["turns_per_s"], 2)
                for variant in ("float32_documents", "int8_documents"):
                    row[f"ratio_{variant}_vs_{name}"] = round(row[f"ours_{variant}"]["turns_per_s"] / row[name]["turns_per_s"], 2)
            result["rounds"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))


if __name__ == "__main__":
    main()

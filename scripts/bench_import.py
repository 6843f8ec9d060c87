"""Bulk import of an export with vectors (issue 25 item 2): memories per second in CPU time and wall.

    python scripts/bench_import.py --memories 20000 build     # an export of N synthetic memories
    python scripts/bench_import.py --memories 20000 import    # import it into a fresh database
    python scripts/bench_import.py --memories 5000 profile    # the same under cProfile (by own time)

The memories are bench_scale.py's (pairs of real pool sentences, vectors from the real MiniLM), so
the export's embedder identity is the real model's and the import reuses every vector: nothing is
re-embedded (the embedder given to the importing engine refuses to embed documents). CPU time is
the figure to compare on a shared machine; wall is given with the load average beside it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale  # noqa: E402
from tinycontext import MemoryEngine, TinyContextConfig  # noqa: E402
from tinycontext.memory import transfer  # noqa: E402

SESSION = "big"


class IdentityOnly:
    """The real embedder's identity, refusing to embed: the import must reuse the file's vectors."""

    def __init__(self, identity: dict):
        self.identity, self.dimensions = identity, identity["dimensions"]

    def embed_query(self, text: str):
        raise AssertionError("the import benchmark recalls nothing")

    def embed_documents(self, texts, *, progress: bool = False):
        raise AssertionError("the bulk import must not embed documents")


def config(root: Path, db: Path, **extra) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=db, models_dir=root / "w" / "models", **extra)


def build(root: Path, n: int) -> None:
    texts, vectors = bench_scale.pool(root / "w")
    real = bench_scale.real_embedder(config(root, root / "unused.db"))
    db = root / f"src{n}.db"
    for p in root.glob(f"src{n}.db*"):
        p.unlink()
    with MemoryEngine(config(root, db, dedup_mode="off"), embedder=IdentityOnly(real.identity)) as engine:
        for c in range(-(-n // 1000)):
            engine.import_memories(bench_scale.chunk_memories(c, min(1000, n - c * 1000), texts, vectors), session_id=SESSION)
        with open(root / f"export{n}.jsonl", "w", encoding="utf-8") as out:
            print(transfer.export_jsonl(engine, out), "memories exported")
    (root / "identity.json").write_text(json.dumps(real.identity))


def timed_import(root: Path, n: int, profile: bool) -> dict:
    identity = json.loads((root / "identity.json").read_text())
    db = root / f"dst{n}.db"
    for p in root.glob(f"dst{n}.db*"):
        p.unlink()
    with MemoryEngine(config(root, db), embedder=IdentityOnly(identity)) as engine:
        _ = engine.embedder  # bind the identity before timing
        profiler = cProfile.Profile() if profile else None
        t, c = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        report = transfer.import_file(engine, root / f"export{n}.jsonl")
        if profiler:
            profiler.disable()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert report.embedded == 0, "the bulk path must not re-embed"
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return {"memories": report.imported, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "per_s_wall": round(report.imported / wall),
            "per_s_cpu": round(report.imported / cpu), "loadavg": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("mode", choices=("build", "import", "profile"))
    parser.add_argument("--memories", type=int, default=20_000)
    parser.add_argument("--root", type=Path, default=Path("/tmp/scale-data"))
    parser.add_argument("--json", type=Path, help="import: also write the figures here")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if args.mode == "build":
        build(args.root, args.memories)
        return
    result = timed_import(args.root, args.memories, args.mode == "profile")
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

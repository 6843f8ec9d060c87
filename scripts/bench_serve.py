"""Sustained throughput of the REST app over loopback HTTP: recalls/s and saves/s with 1, 4 and 8
client processes, with p50/p95 latency. Uses the configured model (built-in by default) on a
temporary database seeded with --seed memories.

    python scripts/bench_serve.py --seconds 5 --clients 1 4 8 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background

TOPICS = ["deploy", "database", "billing", "editor", "travel", "meeting", "allergy", "release", "backup", "alerts"]


def _client(args: tuple[str, str, int, float]) -> list[float]:
    """One client process: requests back to back until the deadline; returns latencies (s)."""
    base, kind, me, seconds = args
    latencies: list[float] = []
    rng = np.random.default_rng(me)
    with httpx.Client(base_url=base, timeout=60) as client:
        deadline = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < deadline:
            topic = TOPICS[int(rng.integers(len(TOPICS)))]
            if kind == "recall":
                body, path = {"query": f"what did we decide about {topic}?", "top_k": 5, "max_tokens": 500}, "/recall_memories"
            else:
                body, path = {"session_id": f"bench{me}", "memories": [{"content": f"client {me} note {n}: {topic} changed at step {n}"}]}, "/save_memories"
            started = time.perf_counter()
            client.post(path, json=body).raise_for_status()
            latencies.append(time.perf_counter() - started)
            n += 1
    return latencies


def run(seconds: float, clients: list[int], seed: int, model: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = TinyContextConfig(memory_db_path=Path(tmp) / "bench.db", embedding_model=model)
        with MemoryEngine(config) as engine:
            engine.save([f"Note {i}: the {TOPICS[i % len(TOPICS)]} decision number {i} was reviewed by team {i % 7}" for i in range(seed)],
                        session_id="seed")
            rows = []
            with background(create_app(engine=engine, settings=ServeSettings())) as base, mp.get_context("spawn").Pool(max(clients)) as pool:
                pool.map(_client, [(base, "recall", i, 0.2) for i in range(max(clients))])  # warm up: imports, connections
                for kind in ("recall", "save"):
                    for n in clients:
                        lat = np.concatenate([np.asarray(x) for x in pool.map(_client, [(base, kind, i, seconds) for i in range(n)])])
                        rows.append({"op": kind, "clients": n, "requests": int(lat.size), "per_s": round(lat.size / seconds, 1),
                                     "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 2),
                                     "p95_ms": round(float(np.percentile(lat, 95)) * 1000, 2)})
                        print(f"{kind:6s} clients={n}: {rows[-1]['per_s']:8.1f}/s  p50 {rows[-1]['p50_ms']:7.2f} ms  p95 {rows[-1]['p95_ms']:7.2f} ms", flush=True)
            identity = engine.embedder.identity["model"]
    return {"model": identity, "seed_memories": seed, "seconds_per_cell": seconds, "machine": platform.machine(),
            "cpus": mp.cpu_count(), "results": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each (operation, clients) cell")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seed", type=int, default=1000, help="memories in the database before measuring")
    parser.add_argument("--model", default="fast", help="embedding_model setting")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report = run(args.seconds, args.clients, args.seed, args.model)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Serving under concurrent clients: the REST API and MCP over Streamable HTTP (the SDK's own client), on
127.0.0.1, with 1/4/16 client processes running a mix of saves and recalls back to back.

    python scripts/bench_serve.py --seconds 5 --clients 1 4 16 [--json out.json]

Mixes: ``recall`` (every request a recall), ``mixed`` (half saves, half recalls), ``save`` (every
request a save of one memory). Recall questions are unique (no embedding-cache hits). Per cell:
requests/s, p50/p95 latency, errors (HTTP errors, tool errors, exceptions), and lost writes: after
each server the memories in its database are counted against the seed plus every save a client saw
acknowledged (a write is lost when the count falls short). Each server gets its own database, seeded
with --seed memories, and uses the configured model (built-in by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from tinycontext import MemoryEngine, TinyContextConfig, close_engines
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background, mcp_app

TOPICS = ["deploy", "database", "billing", "editor", "travel", "meeting", "allergy", "release", "backup", "alerts"]
MIXES = {"recall": 0.0, "mixed": 0.5, "save": 1.0}  # share of saves


def _request(rng, mix: str, me: int, n: int) -> tuple[str, dict]:
    topic = TOPICS[int(rng.integers(len(TOPICS)))]
    if rng.random() < MIXES[mix]:
        return "save", {"session_id": f"bench{me}", "memories": [{"content": f"client {me} note {n}: the {topic} plan changed at step {n}"}]}
    return "recall", {"query": f"what did client {me} decide about {topic} at step {n}?", "top_k": 5, "max_tokens": 500}


def _rest_client(base: str, mix: str, me: int, seconds: float) -> dict:
    out = {"latencies": [], "errors": 0, "saved": 0}
    rng = np.random.default_rng(me)
    with httpx.Client(base_url=base, timeout=120) as client:
        deadline, n = time.perf_counter() + seconds, 0
        while time.perf_counter() < deadline:
            kind, body = _request(rng, mix, me, n)
            started = time.perf_counter()
            try:
                response = client.post(f"/{kind}_memories", json=body)
                response.raise_for_status()
                out["saved"] += len(response.json()["ids"]) if kind == "save" else 0
            except Exception:  # noqa: BLE001 - counted, the run goes on
                out["errors"] += 1
            out["latencies"].append(time.perf_counter() - started)
            n += 1
    return out


async def _mcp_calls(base: str, mix: str, me: int, seconds: float) -> dict:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    out = {"latencies": [], "errors": 0, "saved": 0}
    rng = np.random.default_rng(me)
    async with httpx.AsyncClient(timeout=120) as http, streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            deadline, n = time.perf_counter() + seconds, 0
            while time.perf_counter() < deadline:
                kind, body = _request(rng, mix, me, n)
                started = time.perf_counter()
                try:
                    result = await session.call_tool(f"{kind}_memories", body)
                    if result.isError:
                        out["errors"] += 1
                    elif kind == "save":
                        out["saved"] += len(result.structuredContent["ids"])
                except Exception:  # noqa: BLE001
                    out["errors"] += 1
                out["latencies"].append(time.perf_counter() - started)
                n += 1
    return out


def _client(args: tuple[str, str, str, int, float]) -> dict:
    server, base, mix, me, seconds = args
    return _rest_client(base, mix, me, seconds) if server == "rest" else asyncio.run(_mcp_calls(base, mix, me, seconds))


def _seed(config: TinyContextConfig, n: int) -> None:
    with MemoryEngine(config) as engine:
        engine.save([f"Note {i}: the {TOPICS[i % len(TOPICS)]} decision number {i} was reviewed by team {i % 7}" for i in range(n)],
                    session_id="seed")


def _count(config: TinyContextConfig) -> int:
    with MemoryEngine(config) as engine:
        return engine.stats()["memories"]


def run(seconds: float, clients: list[int], seed: int, model: str, servers: list[str], mixes: list[str]) -> dict:
    rows = []
    for server in servers:
        with tempfile.TemporaryDirectory() as tmp:
            config = TinyContextConfig(memory_db_path=Path(tmp) / "bench.db", embedding_model=model, models_dir=Path(tmp) / "models")
            _seed(config, seed)
            acknowledged = 0
            if server == "rest":
                engine = MemoryEngine(config)
                app = create_app(engine=engine, settings=ServeSettings())
            else:
                engine, app = None, mcp_app(ServeSettings(), config)
            try:
                with background(app) as base, mp.get_context("spawn").Pool(max(clients)) as pool:
                    pool.map(_client, [(server, base, "recall", i, 0.3) for i in range(max(clients))])  # warm up: imports, connections
                    for mix in mixes:
                        for n in clients:
                            loadavg = os.getloadavg()
                            results = pool.map(_client, [(server, base, mix, i, seconds) for i in range(n)])
                            lat = np.concatenate([np.asarray(r["latencies"]) for r in results])
                            acknowledged += sum(r["saved"] for r in results)
                            rows.append({"server": server, "mix": mix, "clients": n, "requests": int(lat.size),
                                         "per_s": round(lat.size / seconds, 1),
                                         "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 2),
                                         "p95_ms": round(float(np.percentile(lat, 95)) * 1000, 2),
                                         "errors": sum(r["errors"] for r in results), "loadavg_1m": round(loadavg[0], 2)})
                            r = rows[-1]
                            print(f"{server:4s} {mix:6s} clients={n:2d}: {r['per_s']:7.1f}/s  p50 {r['p50_ms']:7.1f} ms  "
                                  f"p95 {r['p95_ms']:7.1f} ms  errors {r['errors']}  (load {r['loadavg_1m']})", flush=True)
            finally:
                if engine is not None:
                    engine.close()
                close_engines()
            counted = _count(config)
            lost = seed + acknowledged - counted
            rows.append({"server": server, "acknowledged_saves": acknowledged, "memories_after": counted, "seed": seed, "lost_writes": lost})
            print(f"{server}: {acknowledged} saves acknowledged, {counted} memories after (seed {seed}): lost {lost}", flush=True)
    return {"model": model, "seed_memories": seed, "seconds_per_cell": seconds, "machine": platform.machine(), "cpus": mp.cpu_count(),
            "results": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each (server, mix, clients) cell")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seed", type=int, default=1000, help="memories in each database before measuring")
    parser.add_argument("--model", default="fast", help="embedding_model setting")
    parser.add_argument("--servers", nargs="+", default=["rest", "mcp"], choices=["rest", "mcp"])
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    report = run(args.seconds, args.clients, args.seed, args.model, args.servers, args.mixes)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()

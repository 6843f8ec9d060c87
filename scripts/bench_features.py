"""Figures for issue 10: filtered recall on 50k memories, and first- vs tenth-call recall over MCP HTTP.

    python scripts/bench_features.py filters [--memories 50000] [--runs 15]
    python scripts/bench_features.py http [--servers 3]
    python scripts/bench_features.py languages

``filters``: 50k memories of real SciFact sentences, each with a tag, metadata and a spread of
creation dates; vectors are the real MiniLM vectors of a 2,000-sentence pool (each memory takes its
sentence's vector), queries are real SciFact queries embedded by the model. Recall (hybrid, default
settings) is timed with no filter, a selective filter (0.1% of memories: a tag, a metadata value),
and broad ones (50%: a tag, a created_at range). Medians over ``--runs`` fresh queries each.

``http``: ``tinycontext serve`` (MCP over Streamable HTTP) in a subprocess with the real model and
500 memories; one SDK client session makes ten recalls with different queries. Reports the time
until the server accepted connections, and each call's latency; medians over ``--servers`` servers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.models.embedder import Embedder
from tinycontext.models.hub import builtin_bundle

_NUMBER = re.compile(r" \[\d+\]$")
SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "scifact"


def sentences(limit: int) -> list[str]:
    out: list[str] = []
    with open(SCIFACT / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            for part in json.loads(line)["text"].split(". "):
                if 40 <= len(part) <= 300:
                    out.append(part.strip())
            if len(out) >= limit:
                break
    return out[:limit]


def queries(limit: int) -> list[str]:
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line, _ in zip(fh, range(limit))]


class PoolEmbedder:
    """Real vectors for the pool (looked up, a memory's " [n]" suffix ignored), the real model for queries."""

    def __init__(self, model: Embedder, pool: list[str]):
        self.model = model
        self.dimensions = model.dimensions
        self.identity = model.identity
        self.table = dict(zip(pool, model.embed_documents(pool, progress=True)))

    def embed_documents(self, texts, progress=False):
        return np.stack([self.table[_NUMBER.sub("", t)] for t in texts])

    def embed_query(self, text):
        return self.model.embed_query(text)


def bench_filters(args) -> dict:
    rng = random.Random(0)
    model = Embedder(builtin_bundle())
    pool = sentences(2000)
    embedder = PoolEmbedder(model, pool)
    workdir = Path(tempfile.mkdtemp(prefix="tc-filters-"))
    config = TinyContextConfig(memory_db_path=workdir / "m.db", models_dir=workdir / "models", dedup_mode="off")
    with MemoryEngine(config, embedder=embedder) as engine:
        for start in range(0, args.memories, 1000):
            batch = []
            for n in range(start, min(start + 1000, args.memories)):
                rare = n % 1000 == 7
                # Identical texts in one session are skipped as duplicates: each memory gets its number.
                batch.append({"content": f"{rng.choice(pool)} [{n}]",
                              "tags": ["rare" if rare else "common", "even" if n % 2 == 0 else "odd"],
                              "metadata": {"kind": "rare" if rare else "common"}})
            engine.save(batch)
        # Spread creation dates over 2024 so a range filter is broad but not everything.
        engine.store.conn.execute("UPDATE memories SET created_at = printf('2024-%02d-15T00:00:00.000000+00:00', 1 + id % 12)")
        engine.index.clear()
        assert engine.stats()["memories"] == args.memories, engine.stats()
        cases = {
            "none": None,
            "selective tag (0.1%)": {"tags_all": ["rare"]},
            "selective metadata (0.1%)": {"metadata": {"kind": "rare"}},
            "broad tag (50%)": {"tags_any": ["even"]},
            "broad created_at (50%)": {"created_at": {"gte": "2024-01-01", "lt": "2024-07-01"}},
        }
        qs = queries(args.runs * len(cases) + 5)
        for q in qs[:5]:
            engine.recall(q)  # warm: vector copy loaded, caches filled
        results = {}
        cursor = 5
        for name, filters in cases.items():
            times, found = [], []
            for _ in range(args.runs):
                q = qs[cursor]
                cursor += 1
                started = time.perf_counter()
                out = engine.recall(q, filters=filters)
                times.append((time.perf_counter() - started) * 1000)
                found.append(len(out["memories"]))
            results[name] = {"p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1),
                             "memories_returned_median": statistics.median(found)}
    return {"memories": args.memories, "runs": args.runs, "load": os.getloadavg(), "recall": results}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_http(args) -> dict:
    import anyio
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    pool = sentences(500)
    qs = queries(10 * args.servers)
    runs = []
    for server_index in range(args.servers):
        workdir = Path(tempfile.mkdtemp(prefix="tc-http-"))
        config = TinyContextConfig(memory_db_path=workdir / "m.db", models_dir=workdir / "models")
        with MemoryEngine(config) as engine:
            engine.save(pool)
        port = _free_port()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")},
               "TINYCONTEXT_MEMORY_DB_PATH": str(config.memory_db_path), "TINYCONTEXT_MODELS_DIR": str(config.models_dir),
               "TINYCONTEXT_CONFIG_PATH": str(workdir / "none.json")}
        (workdir / "none.json").write_text("{}")
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "tinycontext.cli.commands", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.perf_counter() - started > 120:
                        raise RuntimeError("server did not start")
                    time.sleep(0.05)
            ready_s = time.perf_counter() - started

            async def session_calls():
                latencies = []
                async with httpx.AsyncClient(timeout=120) as http, \
                        streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write, _):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        for q in qs[server_index * 10:(server_index + 1) * 10]:
                            t = time.perf_counter()
                            result = await session.call_tool("recall_memories", {"query": q})
                            latencies.append((time.perf_counter() - t) * 1000)
                            assert not result.isError
                return latencies

            latencies = anyio.run(session_calls)
        finally:
            proc.terminate()
            proc.wait(30)
        runs.append({"ready_s": round(ready_s, 2), "calls_ms": [round(x, 1) for x in latencies]})
        print(runs[-1], file=sys.stderr)
    return {
        "servers": args.servers, "load": os.getloadavg(),
        "ready_s_median": statistics.median(r["ready_s"] for r in runs),
        "first_call_ms_median": statistics.median(r["calls_ms"][0] for r in runs),
        "tenth_call_ms_median": statistics.median(r["calls_ms"][9] for r in runs),
        "calls_2_to_10_ms_median": statistics.median(x for r in runs for x in r["calls_ms"][1:]),
        "runs": runs,
    }


def bench_languages(args) -> dict:
    """Rank-1 and top-3 recall on tests/fixtures/multilingual.json per FTS tokenizer, BM25 alone and
    hybrid with the bundled (English) MiniLM."""
    data = json.loads((Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "multilingual.json").read_text(encoding="utf-8"))
    cases, distractors = data["cases"], data["distractors"]
    model = Embedder(builtin_bundle())
    out = {}
    for tokenizer in ("porter", "unicode61", "trigram"):
        workdir = Path(tempfile.mkdtemp(prefix="tc-lang-"))
        config = TinyContextConfig(memory_db_path=workdir / "m.db", models_dir=workdir / "models", fts_tokenizer=tokenizer)
        with MemoryEngine(config, embedder=model) as engine:
            ids = dict(zip(cases, engine.save([m for m, _ in cases.values()] + distractors)["ids"]))
            for mode, weight in (("bm25", 0.0), ("hybrid", None)):
                ranks = {}
                for name, (_, query) in cases.items():
                    found = [m["id"] for m in engine.recall(query, dense_weight=weight)["memories"]]
                    ranks[name] = found.index(ids[name]) + 1 if ids[name] in found else None
                out[f"{tokenizer}/{mode}"] = {
                    "rank1": f"{sum(r == 1 for r in ranks.values())}/{len(ranks)}",
                    "top3": f"{sum(r is not None and r <= 3 for r in ranks.values())}/{len(ranks)}", "ranks": ranks}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    f = sub.add_parser("filters")
    f.add_argument("--memories", type=int, default=50_000)
    f.add_argument("--runs", type=int, default=15)
    h = sub.add_parser("http")
    h.add_argument("--servers", type=int, default=3)
    sub.add_parser("languages")
    args = parser.parse_args()
    result = {"filters": bench_filters, "http": bench_http, "languages": bench_languages}[args.part](args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

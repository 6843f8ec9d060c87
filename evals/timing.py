"""Live cost measurements: recall latency, indexing throughput, peak RSS. Nothing is replayed.

- Latency: ``MemoryEngine.recall`` on the production path (its own uncached ``Embedder``, the query
  embedded in parallel with BM25 exactly as in production, default threads), after a warm-up.
- Each job times ``latency.passes`` passes over the same queries and samples the host's load during
  each (1-minute load average, CPU used by other processes); a pass with more competing CPU than
  ``latency.max_competing_cores`` is flagged and tried again (``latency.retries``). The report derives
  p50/p95 with bootstrap CIs from the unflagged passes, and a job with none is flagged, never
  trusted by ``recommend --max-p95-ms``.
- Timing passes run alone: every job holds a shared lock on ``<cache_dir>/timing.lock`` while it
  indexes or runs its quality pass and an exclusive one while it times, so with parallel workers
  (joblib, several processes on a host) no harness job computes while another measures.
- Indexing throughput and peak RSS come from a fresh process per model (``python -m evals.probe``)
  that indexes a fixed sample of the dataset through ``MemoryEngine.save`` and recalls from it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from tinycontext import MemoryEngine

LOCK_FILE = "timing.lock"


@contextlib.contextmanager
def _flock(cache_dir: Path, mode: int) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh, mode)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def computing(cache_dir: Path):
    """Held while a job computes (index, quality pass): any number at once, but never while one times."""
    return _flock(cache_dir, fcntl.LOCK_SH)


def timing_alone(cache_dir: Path):
    """Held while a job measures: no other harness job on this host computes or measures meanwhile."""
    return _flock(cache_dir, fcntl.LOCK_EX)


def recall_latencies(engine: MemoryEngine, queries: list[tuple[str, str | None]], warmup: list[tuple[str, str | None]],
                     kwargs: dict) -> list[float]:
    """Milliseconds per live ``engine.recall`` (query embedding included), after ``warmup`` recalls."""
    for text, session in warmup:
        engine.recall(text, session_id=session, **kwargs)
    out = []
    for text, session in queries:
        started = time.perf_counter()
        engine.recall(text, session_id=session, **kwargs)
        out.append((time.perf_counter() - started) * 1000)
    return out


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def _own_seconds(me: psutil.Process) -> float:
    t = me.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def timed_pass(measure) -> dict:
    """Run ``measure()`` (a list of milliseconds) and sample the host's load around it: the 1-minute load
    average before and after, and the CPU other processes used meanwhile (competing cores: their CPU
    seconds over the pass's wall time)."""
    me = psutil.Process()
    load_before = os.getloadavg()[0]
    busy, own, started = _busy_seconds(), _own_seconds(me), time.perf_counter()
    ms = measure()
    wall = max(time.perf_counter() - started, 1e-9)
    competing = max(0.0, (_busy_seconds() - busy) - (_own_seconds(me) - own)) / wall
    return {"ms": ms, "load1_before": round(load_before, 2), "load1_after": round(os.getloadavg()[0], 2),
            "competing_cores": round(competing, 3), "seconds": round(wall, 3)}


def timing_passes(measure, *, passes: int, max_competing_cores: float, retries: int, pause_s: float = 2.0) -> list[dict]:
    """Timing passes until ``passes`` ran without external load or ``retries`` extra ones were spent. A
    pass in which other processes used more than ``max_competing_cores`` is marked ``loaded``. Every
    pass is kept, loaded ones too, so the report can show what was excluded."""
    out: list[dict] = []
    while sum(not p["loaded"] for p in out) < passes and len(out) < passes + retries:
        result = timed_pass(measure)
        result["loaded"] = result["competing_cores"] > max_competing_cores
        out.append(result)
        if result["loaded"] and len(out) < passes + retries:
            time.sleep(pause_s)  # let a burst of other work pass
    return out


def probe(request: dict) -> dict:
    """Run ``evals.probe`` in a fresh interpreter: {index_docs_per_s, index_sample_docs, peak_rss_mb}."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    result = subprocess.run([sys.executable, "-m", "evals.probe"], input=json.dumps(request), capture_output=True,
                            text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"evals.probe failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])

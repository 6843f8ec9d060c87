"""Live cost measurements: recall latency, indexing throughput, peak RSS. Nothing is replayed.

- Latency: ``MemoryEngine.recall`` on the production path (its own uncached ``Embedder``, the query
  embedded in parallel with BM25 exactly as in production, default threads), after a warm-up.
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


def probe(request: dict) -> dict:
    """Run ``evals.probe`` in a fresh interpreter: {index_docs_per_s, index_sample_docs, peak_rss_mb}."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    result = subprocess.run([sys.executable, "-m", "evals.probe"], input=json.dumps(request), capture_output=True,
                            text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"evals.probe failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])

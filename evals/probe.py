"""A fresh process that measures one model as deployed: indexing throughput and peak RSS.

Reads a JSON request on stdin (model settings, engine overrides, a fixed sample of documents and
queries), builds a temporary database through ``MemoryEngine.save`` exactly as production does, and
prints one JSON line. Run by :func:`evals.timing.probe`; its peak RSS is this process's own, not a
long-lived worker's: Linux's ``VmHWM`` (the high-water mark of this address space, which starts
empty at exec). ``ru_maxrss`` is not used where VmHWM exists: exec carries the parent's high-water
mark into it, so a probe launched by a worker that had built an index reported the worker's peak
(720-1,540 MB for one config; notes/harness_trust.md, "Peak RSS").
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from tinycontext import Embedder, MemoryEngine, TinyContextConfig, resolve_model


def measure(request: dict) -> dict:
    docs: list[dict] = request["docs"]  # {"text", "session"}
    warm = request.get("warmup_docs", 8)
    with tempfile.TemporaryDirectory(prefix="tinycontext-probe-") as tmp:
        # fields: the embedding settings (evals.models.EvalModel.engine_fields); an embedding server's own
        # memory is not this process's, so its peak RSS is the client's only.
        config = TinyContextConfig(memory_db_path=Path(tmp) / "probe.db", models_dir=request["models_dir"],
                                   **request["fields"], **request.get("engine", {}))
        embedder = None
        if request.get("pooling"):  # the engine config has no pooling key: build the embedder as the runner does
            embedder = Embedder(resolve_model(config.embedding_model, config.models_dir), batch_size=config.embedding_batch_size,
                                cache_size=config.embedding_cache_size, pooling=request["pooling"],
                                query_prefix=config.dense_query_prefix, document_prefix=config.dense_document_prefix)
        with MemoryEngine(config, embedder=embedder) as engine:
            engine.save([{"content": d["text"]} for d in docs[:warm]], session_id="warmup")
            timed = docs[warm:]
            started = time.perf_counter()
            by_session: dict[str, list[str]] = {}
            for d in timed:
                by_session.setdefault(d["session"], []).append(d["text"])
            for session, texts in by_session.items():
                for i in range(0, len(texts), config.max_batch_size):
                    engine.save(texts[i:i + config.max_batch_size], session_id=session)
            seconds = time.perf_counter() - started
            for query in request.get("queries", []):
                engine.recall(query["text"], session_id=query.get("session"))
    return {"index_docs_per_s": len(timed) / max(seconds, 1e-9), "index_sample_docs": len(timed), "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB, without its parent's (see the module docstring)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc: macOS (bytes) or a BSD (KiB)
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def main() -> None:
    print(json.dumps(measure(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()

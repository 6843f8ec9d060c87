"""What a result was measured on: package versions, CPU, thread settings, load average."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import psutil
from threadpoolctl import threadpool_info

PACKAGES = ("tinycontext", "onnxruntime", "tokenizers", "tiktoken", "sqlite-vec", "sqlean.py", "numpy",
            "hydra-core", "ir-measures", "pandas", "matplotlib", "scipy")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TINYCONTEXT_EMBEDDING_BATCH_SIZE")


def environment() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    freq = psutil.cpu_freq()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model() or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_mhz": round(freq.max or freq.current) if freq else None,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        # onnxruntime runs with its default intra-op threads (one per physical core), as in production.
        "threads": {"env": {k: os.environ.get(k) for k in THREAD_VARS},
                    "blas": [{k: i.get(k) for k in ("internal_api", "num_threads")} for i in threadpool_info()]},
        "packages": versions,
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None

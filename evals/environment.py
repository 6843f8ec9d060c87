"""What a result was measured on: package versions, CPU, and peak memory during a run."""

from __future__ import annotations

import os
import platform
import threading
from importlib import metadata
from typing import Self

import psutil

PACKAGES = ("tinycontext", "onnxruntime", "tokenizers", "tiktoken", "sqlite-vec", "sqlean.py", "numpy",
            "hydra-core", "ir-measures", "pandas", "matplotlib")


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


class PeakRSS:
    """Samples this process's resident memory in a background thread; ``peak_mb`` after exit."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._process = psutil.Process()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._process.memory_info().rss)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20

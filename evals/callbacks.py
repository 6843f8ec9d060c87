"""Hydra callback: count a sweep's jobs at the start (for progress/ETA), aggregate it at the end.

``on_multirun_end`` is Hydra's only hook after all jobs of a multirun; it runs on the launching
machine, also with the joblib, submitit or Ray launchers.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)
SWEEP_FILE = "sweep.json"
PROGRESS_FILE = "progress.jsonl"


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch: the product of the sweep lists."""
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    try:
        overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        sizes: dict[str, int] = {}
        for o in overrides:
            if o.is_sweep_override():
                sizes[o.get_key_element()] = len(list(o.sweep_string_iterator()))
        return math.prod(sizes.values())
    except (HydraException, ValueError, TypeError):  # e.g. an unbounded range: progress shows done counts only
        return None


class SweepReport(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = count_jobs(config)
        (sweep_dir / SWEEP_FILE).write_text(json.dumps({"total": total, "started": time.time()}), encoding="utf-8")
        (sweep_dir / PROGRESS_FILE).unlink(missing_ok=True)
        log.info("sweep of %s configs into %s", total if total is not None else "?", sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from .report import build_report

        report = build_report(Path(config.hydra.sweep.dir))
        log.info("report written: %s (results.csv, per_query.csv, plots/ beside it)", report)


def record_progress(sweep_dir: Path, job: str, seconds: float) -> str:
    """Append this job's completion and return 'k/N configs done, ETA ...' for the log."""
    with open(sweep_dir / PROGRESS_FILE, "a", encoding="utf-8") as fh:  # one short O_APPEND write per job
        fh.write(json.dumps({"job": job, "seconds": seconds, "at": time.time()}) + "\n")
    with open(sweep_dir / PROGRESS_FILE, encoding="utf-8") as fh:
        done = sum(1 for _ in fh)
    try:
        meta = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        meta = {}
    total, started = meta.get("total"), meta.get("started")
    if not total or not started:
        return f"{done} configs done"
    elapsed = time.time() - started
    eta = elapsed / done * max(total - done, 0)
    return f"{done}/{total} configs done, elapsed {elapsed:.0f}s, ETA {eta:.0f}s"

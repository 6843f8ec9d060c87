"""Hydra's basic sweeper, except that finished jobs never reach the launcher.

Before a batch is launched, the launching process composes each job's config and asks the results
store whether that job (same config, data, model and code) has finished; those are written into
their job directories from the store (``evals.runner.reuse_finished``), and only the others go to
the launcher (joblib, submitit, Ray), in contiguous blocks so job numbers and directories are kept.
A repeated sweep therefore starts no worker at all. ``force=true`` launches every job.

It lives in ``hydra_plugins`` because Hydra instantiates sweepers only from there.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


class _SkipFinished(Launcher):
    """Wraps the configured launcher; launches only jobs the results store does not hold."""

    def __init__(self, inner: Launcher, hydra_context: HydraContext, config: DictConfig) -> None:
        self.inner, self.hydra_context, self.config = inner, hydra_context, config
        self._composed: dict[tuple[str, ...], DictConfig] = {}

    def setup(self, **kwargs) -> None:  # the inner launcher is set up already
        pass

    def _job_config(self, overrides: Sequence[str]) -> DictConfig:
        """The job's config as Hydra composes it, composing once per set of config-group choices: Hydra
        builds the config from the group choices, then applies the other (value) overrides in order,
        which is what is done here on a copy (composing costs ~0.1 s, a sweep has many jobs)."""
        loader = self.hydra_context.config_loader
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(list(overrides))
        # Hydra's own split (hydra._internal.defaults_list.Overrides): a group override picks a config.
        is_group = [not isinstance(o.value(), dict) and loader.repository.group_exists(o.key_or_group) for o in parsed]
        groups = tuple(o.input_line for o, g in zip(parsed, is_group) if g)
        if groups not in self._composed:
            self._composed[groups] = loader.load_sweep_config(self.config, list(groups))
        cfg = copy.deepcopy(self._composed[groups])
        ConfigLoaderImpl._apply_overrides_to_config([o for o, g in zip(parsed, is_group) if not g], cfg)
        task = [o for o in parsed if not o.is_hydra_override()]
        dirname = cfg.hydra.job.config.override_dirname
        with open_dict(cfg):  # what Hydra records about the job's own overrides (a sweep subdir may use them)
            cfg.hydra.overrides.task = [o.input_line for o in task]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=task, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
        return cfg

    def _reused(self, overrides: Sequence[str], idx: int) -> JobReturn | None:
        from evals.runner import reuse_finished

        cfg = self._job_config(overrides)
        with open_dict(cfg):
            cfg.hydra.job.num = idx
            cfg.hydra.job.id = f"reused_{idx}"
        output_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        task_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        record = reuse_finished(task_cfg, output_dir, list(overrides))
        if record is None:
            return None
        ret = JobReturn(overrides=list(overrides), cfg=task_cfg, hydra_cfg=cfg, working_dir=str(output_dir),
                        task_name=str(cfg.hydra.job.name), status=JobStatus.COMPLETED)
        ret.return_value = float(record["row"]["ndcg@10"])  # what the task function returns
        return ret

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        results: list[JobReturn | None] = [self._reused(o, initial_job_idx + i) for i, o in enumerate(job_overrides)]
        reused = sum(r is not None for r in results)
        if reused:
            log.info("%d of %d jobs already finished: taken from the results store, not launched", reused, len(results))
        start = 0
        while start < len(results):
            if results[start] is not None:
                start += 1
                continue
            end = start
            while end < len(results) and results[end] is None:
                end += 1
            results[start:end] = self.inner.launch(job_overrides[start:end], initial_job_idx=initial_job_idx + start)
            start = end
        return results


class ReusingSweeper(BasicSweeper):
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.reusing = not config.get("force")
        if self.reusing:
            self.launcher = _SkipFinished(self.launcher, hydra_context, config)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        # _SkipFinished composes every job of the batch before launching any: the same early check,
        # without composing each config twice.
        if not self.reusing:
            super().validate_batch_is_legal(batch)

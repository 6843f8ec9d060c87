"""Every Hydra config of the evaluation harness composes, resolves and points at real assets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import evals.run  # noqa: F401  (registers the tc_default resolver)
from evals.callbacks import count_jobs
from tinycontext import TinyContextConfig

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture(scope="module", autouse=True)
def hydra_conf():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield


def composed(overrides: list[str], hydra: bool = False):
    return compose("config", overrides=overrides, return_hydra_config=hydra)


@pytest.mark.parametrize("group", ["dataset", "embedder", "retrieval", "budget", "experiment"])
def test_every_option_composes_and_resolves(group, shared_dir, monkeypatch):
    monkeypatch.delenv("TINYCONTEXT_SHARED", raising=False)
    names = options(group)
    assert names, f"no configs in {group}/"
    for name in names:
        data = OmegaConf.to_container(composed([f"{group}={name}"]), resolve=True, throw_on_missing=False)
        assert {"dataset", "embedder", "retrieval", "budget"} <= set(data)
        assert data["embedder"]["name"] and "_target_" in data["dataset"]
        # Paths into ../shared are relative to the repo root (the launch dir): they must exist from there.
        for path in (data["embedder"]["model"], data["dataset"].get("path")):
            if isinstance(path, str) and path.startswith("../shared"):
                assert (REPO / path).exists(), f"{group}={name}: {path}"


def test_defaults_are_the_engine_defaults():
    cfg = composed([])
    engine = TinyContextConfig()
    assert cfg.retrieval.dense_weight == engine.recall_dense_weight
    assert cfg.retrieval.rrf_k == engine.recall_rrf_k
    assert cfg.retrieval.top_k == engine.recall_top_k
    assert cfg.retrieval.candidates == engine.recall_candidates
    assert cfg.budget.max_tokens == engine.recall_max_tokens
    assert cfg.dataset.name == "tiny" and cfg.embedder.model == "fast"


def test_variants_change_only_what_they_say():
    base = composed(["embedder=minilm-int8"]).embedder
    cls = composed(["embedder=minilm-int8-cls"]).embedder
    prefix = composed(["embedder=minilm-int8-prefix"]).embedder
    assert cls.model == base.model and cls.pooling == "cls" and base.pooling is None
    assert prefix.model == base.model and prefix.query_prefix and prefix.document_prefix


@pytest.mark.parametrize("experiment,jobs", [("tiny_sweep", 6), ("scifact_sweep", 40), ("sweep", 40), ("locomo_budget", 5),
                                             ("locomo_dev", 20), ("locomo_conversation", 8)])
def test_presets_are_ready_multiruns(experiment, jobs):
    cfg = composed([f"experiment={experiment}"], hydra=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert count_jobs(cfg) == jobs


def test_command_line_sweeps_are_counted_with_preset_params():
    cfg = composed(["experiment=tiny_sweep"], hydra=True)
    # On the command line the task overrides hold the sweep as typed; the callback multiplies it in.
    OmegaConf.update(cfg, "hydra.overrides.task", ["embedder=fast,minilm-int8"], force_add=True)
    assert count_jobs(cfg) == 12

"""The same 2-job sweep through Hydra's joblib and submitit (local executor) launchers: submitit
gives the joblib run's results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "dataset=tiny", "retrieval.dense_weight=0,1", "latency.queries=3", "latency.warmup=1",
         "latency.index_sample=10", "force=true"]
SAME = ["dense_weight", "ndcg@10", "recall@10", "recall@100", "mrr@10", "budget_recall", "tune_ndcg@10",
        "ndcg@10_ci_low", "ndcg@10_ci_high", "tokens_returned", "tokens_naive"]

pytestmark = pytest.mark.slow


def sweep(out: Path, cache: Path, *launcher: str) -> pd.DataFrame:
    result = subprocess.run([sys.executable, "-m", "evals.run", *SWEEP, *launcher, f"hydra.sweep.dir={out}"], cwd=REPO,
                            capture_output=True, text=True, timeout=900,
                            env={**os.environ, "TINYCONTEXT_EVAL_CACHE": str(cache)})
    assert result.returncode == 0, f"{launcher}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return pd.read_csv(out / "results.csv").sort_values("dense_weight").reset_index(drop=True)


@pytest.fixture(scope="module")
def joblib_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    rows = sweep(root / "joblib", root / "cache", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert len(rows) == 2 and not rows["index_reused"].all()
    return root, rows


def test_submitit_local_matches_joblib(joblib_run):
    root, expected = joblib_run
    rows = sweep(root / "submitit", root / "cache", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=15")
    assert (root / "submitit" / ".submitit").is_dir()  # the jobs really went through submitit
    pd.testing.assert_frame_equal(rows[SAME], expected[SAME])

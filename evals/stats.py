"""Statistics over per-query scores: paired bootstrap confidence intervals, paired tests, Holm.

Every config of a dataset is scored on the same queries in the same order, and the bootstrap draws
its resamples from a fixed seed, so the intervals of two configs come from the same resampled query
sets: they are paired, and a difference of two configs has a CI of its own (``diff_ci``).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 20260


def bootstrap_ci(values, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over queries (fixed seed: paired across configs)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    if arr.size == 1 or np.all(arr == arr[0]):
        return float(arr[0]), float(arr[0])
    result = stats.bootstrap((arr,), np.mean, n_resamples=resamples, confidence_level=confidence, method="percentile",
                             vectorized=True, rng=np.random.default_rng(SEED))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def diff_ci(a, b, **kwargs) -> tuple[float, float]:
    """CI of mean(a - b) over the same queries."""
    return bootstrap_ci(np.asarray(a, dtype=float) - np.asarray(b, dtype=float), **kwargs)


def paired_p(a, b) -> float:
    """Two-sided paired t-test p-value; identical score vectors give 1 (nothing to test)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or np.allclose(a, b):
        return 1.0
    p = stats.ttest_rel(a, b).pvalue
    return 1.0 if np.isnan(p) else float(p)


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); NaN entries stay NaN."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m = valid.size
    if m == 0:
        return out
    order = valid[np.argsort(p[valid], kind="stable")]
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out


def summary(values, name: str) -> dict[str, float]:
    """``{name: mean, name_ci_low, name_ci_high}`` of per-query values."""
    arr = np.asarray(values, dtype=float)
    low, high = bootstrap_ci(arr)
    return {name: float(arr.mean()) if arr.size else float("nan"), f"{name}_ci_low": low, f"{name}_ci_high": high}

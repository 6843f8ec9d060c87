"""Statistics over per-query scores: paired bootstrap confidence intervals, paired superiority
tests, TOST equivalence tests, Holm.

Every config of a dataset is scored on the same queries in the same order, and the bootstrap draws
its resamples from a fixed seed (the same index matrix for every vector of one length), so the
intervals of two configs come from the same resampled query sets: they are paired, and a
difference of two configs has a CI of its own (``diff_ci``).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 20260
BLOCK = 1000  # resamples gathered at once (bounds memory on long vectors)
# Equivalence margin of the TOST (absolute, in units of the metric): configs whose mean differs from
# the best by less than this, with 95% confidence, are equivalent.
MARGIN = 0.005


@functools.lru_cache(maxsize=8)
def _indices(n: int, resamples: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, n, size=(resamples, n), dtype=np.int32)


@functools.lru_cache(maxsize=8)
def _weights(n: int, resamples: int) -> np.ndarray:
    """How often each query is drawn in each resample, over n: the resampled means are one product."""
    idx = _indices(n, resamples)
    counts = np.zeros((resamples, n), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(resamples), n), idx.ravel()), 1.0)
    return counts / n


def _resampled(arr: np.ndarray, statistic, resamples: int) -> np.ndarray:
    if statistic is None:
        return _weights(arr.size, resamples) @ arr
    idx = _indices(arr.size, resamples)
    return np.concatenate([statistic(arr[idx[i:i + BLOCK]]) for i in range(0, resamples, BLOCK)])


def bootstrap_ci(values, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, statistic=None) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic`` (default: the mean) over queries, ``resamples`` draws
    from a fixed seed (paired across configs)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    if arr.size == 1 or np.all(arr == arr[0]):
        return float(arr[0]), float(arr[0])
    draws = _resampled(arr, statistic, resamples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def percentile_ci(values, q: float, **kwargs) -> tuple[float, float]:
    """Bootstrap CI of the ``q``-th percentile (latency p50/p95)."""
    return bootstrap_ci(values, statistic=lambda m: np.percentile(m, q, axis=1), **kwargs)


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


def tost_p(a, b, margin: float = MARGIN) -> float:
    """Paired TOST p-value that mean(a - b) lies within (-margin, margin): the larger of the two
    one-sided t-tests' p-values. Small means equivalent; identical vectors are equivalent (0)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size < 2:
        return 1.0
    if np.allclose(d, d[0]):
        return 0.0 if abs(d[0]) < margin else 1.0
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


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

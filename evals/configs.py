"""Naming a sweep's configs: which axes a sweep varied, a config's short label, and the metric that
judges it. Shared by the report (:mod:`.report`) and its plots (:mod:`.plots`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

SWEEPABLE = ["embedder", "pooling", "query_prefix", "document_prefix", "dense_weight", "rrf_k", "top_k",
             "candidates", "max_tokens"]


def sweepable(rows: pd.DataFrame) -> list[str]:
    """Fixed axes plus any engine setting or recall argument a sweep passed through (engine.*, recall.*)."""
    return [*SWEEPABLE, *[c for c in rows.columns if c.startswith(("engine.", "recall."))]]


def swept(rows: pd.DataFrame) -> dict[str, list]:
    out = {c: rows[c].drop_duplicates().sort_values().tolist() for c in sweepable(rows)
           if c in rows and rows[c].astype(str).nunique() > 1}
    if "pooling" in out and "embedder" in out and (rows.groupby("embedder")["pooling"].nunique() == 1).all():
        del out["pooling"]  # each embedder has its own pooling: not an axis of its own
    return out


def label(row: pd.Series, axes: list[str]) -> str:
    """A short name for a config: the values of the swept axes."""
    short = {"dense_weight": "w", "rrf_k": "k", "max_tokens": "budget", "candidates": "cand", "top_k": "top"}
    parts = []
    for axis in axes:
        value = row[axis]
        value = f"{value:g}" if isinstance(value, (float, np.floating)) else value
        parts.append(f"{short.get(axis, axis.split('.')[-1])}={value}" if axis != "embedder" else str(value))
    return " ".join(parts) or str(row.get("job", ""))


def primary_metric(rows: pd.DataFrame) -> str:
    """Budget sweeps are judged by what the agent sees; ranking sweeps by nDCG@10."""
    return "budget_recall" if rows["max_tokens"].nunique() > 1 else "ndcg@10"

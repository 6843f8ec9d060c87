"""The sweep report's plots: quality against latency and memory (with the Pareto front), quality
against the dense weight, and tokens returned against recall within the budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

# Figure without pyplot renders with Agg and leaves the caller's backend alone (headless servers, notebooks).
from matplotlib.figure import Figure

from .configs import label, primary_metric, swept


def _scatter_panel(ax, part: pd.DataFrame, x: str, metric: str, axes: list[str], chosen: str | None, xlabel: str) -> None:
    y, low, high = part[f"tune_{metric}"], part[f"tune_{metric}_ci_low"], part[f"tune_{metric}_ci_high"]
    ax.errorbar(part[x], y, yerr=[y - low, high - y], fmt="o", color="tab:blue", ecolor="lightsteelblue", capsize=2,
                markersize=4, label="config (95% CI, tuning split)")
    front = pareto_front(part, x, f"tune_{metric}")
    ax.plot(front[x], front[f"tune_{metric}"], color="tab:orange", drawstyle="steps-post", label="Pareto front")
    labelled = front if len(front) <= 12 else front.iloc[:: max(1, len(front) // 12)]
    for _, row in labelled.iterrows():
        ax.annotate(label(row, axes), (row[x], row[f"tune_{metric}"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if chosen is not None and chosen in set(part["job"]):
        pick = part[part["job"] == chosen].iloc[0]
        ax.scatter([pick[x]], [pick[f"tune_{metric}"]], marker="*", s=220, color="tab:red", zorder=5,
                   label=f"recommended: {label(pick, axes)}")
    ax.set(xlabel=xlabel, ylabel=f"{metric} (tuning split)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def pareto_front(part: pd.DataFrame, cost: str, quality: str) -> pd.DataFrame:
    """Configs no other config beats on both lower cost and higher quality, by increasing cost."""
    ordered = part.sort_values([cost, quality], ascending=[True, False])
    best, keep = -np.inf, []
    for idx, row in ordered.iterrows():
        if row[quality] > best:
            keep.append(idx)
            best = row[quality]
    return ordered.loc[keep]


def write_plots(rows: pd.DataFrame, out: Path, chosen: dict[str, str] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    chosen = chosen or {}
    written = []
    datasets = sorted(rows["dataset"].unique())
    axes = list(swept(rows))

    # Pareto: quality (tuning split, CI bars) against p95 latency and against peak RSS.
    fig = Figure(figsize=(13, 4.8 * len(datasets)))
    grid = fig.subplots(len(datasets), 2, squeeze=False)
    for (ax_lat, ax_ram), name in zip(grid, datasets):
        part = rows[rows["dataset"] == name]
        metric = primary_metric(part)
        _scatter_panel(ax_lat, part, "recall_p95_ms", metric, axes, chosen.get(name), "recall p95 latency (ms, live, alone)")
        ax_lat.set_title(f"{name}: quality vs latency")
        _scatter_panel(ax_ram, part, "peak_rss_mb", metric, axes, chosen.get(name), "peak RSS of a fresh process (MB)")
        ax_ram.set_title(f"{name}: quality vs memory")
    written.append(_save(fig, out / "pareto.png"))

    # Quality vs dense weight, one line per (embedder, rrf_k), legend beside the axes.
    fig = Figure(figsize=(9, 4.5 * len(datasets)))
    grid = fig.subplots(len(datasets), 1, squeeze=False)
    for ax, name in zip(grid[:, 0], datasets):
        part = rows[rows["dataset"] == name]
        for (embedder, k), group in part.groupby(["embedder", "rrf_k"]):
            group = group.groupby("dense_weight", as_index=False)[["tune_ndcg@10", "ndcg@10"]].max()
            ax.plot(group["dense_weight"], group["tune_ndcg@10"], marker="o", label=f"{embedder}, k={k:g}")
        ax.set(title=f"{name}: nDCG@10 (tuning split) vs dense weight", xlabel="dense weight (0 = BM25 alone, 1 = dense alone)",
               ylabel="nDCG@10")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    written.append(_save(fig, out / "quality_vs_dense_weight.png"))

    # Budget: tokens the agent receives vs recall within that budget, with R@10 unlimited for reference.
    fig = Figure(figsize=(9, 4.5 * len(datasets)))
    grid = fig.subplots(len(datasets), 1, squeeze=False)
    for ax, name in zip(grid[:, 0], datasets):
        part = rows[rows["dataset"] == name]
        groups = [c for c in axes if c != "max_tokens"][:3]
        for key, group in (part.groupby(groups) if groups else [((), part)]):
            group = group.sort_values("tokens_returned")
            text = label(group.iloc[0], groups) or "config"
            y = group["budget_recall"]
            ax.errorbar(group["tokens_returned"], y, yerr=[y - group["budget_recall_ci_low"], group["budget_recall_ci_high"] - y],
                        marker="o", capsize=2, label=text)
            for _, row in (group.iterrows() if "max_tokens" in axes else []):  # one budget: nothing to label
                ax.annotate(f"{int(row['max_tokens'])}", (row["tokens_returned"], row["budget_recall"]),
                            textcoords="offset points", xytext=(3, -10), fontsize=7)
        ax.axhline(part["recall@10"].max(), color="grey", linestyle=":", label="best R@10, unlimited budget")
        ax.axvline(part["tokens_naive"].mean(), color="grey", linestyle="--", label="fixed naive baseline (mean tokens)")
        ax.set(title=f"{name}: tokens returned vs recall within the budget"
               + (" (labels: max_tokens)" if "max_tokens" in axes else f" (max_tokens {int(part['max_tokens'].iloc[0])})"),
               xscale="log",
               xlabel="tokens returned per query (mean, log scale)", ylabel="recall within budget (test split)")
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()[0]
        if len(handles) <= 16:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    written.append(_save(fig, out / "tokens_vs_recall.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path

"""Aggregate a sweep directory into results.csv, per_query.csv, report.md and PNG plots, and pick
the best config under constraints (``recommend``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

# Figure without pyplot renders with Agg and leaves the caller's backend alone (headless servers, notebooks).
from matplotlib.figure import Figure

from tinycontext import load_config
from tinycontext.errors import ConfigError

from .metrics import MEASURES

KEY_COLUMNS = ["dataset", "embedder", "pooling", "query_prefix", "document_prefix", "dense_weight", "rrf_k",
               "top_k", "candidates", "max_tokens"]
RESULT_COLUMNS = [*MEASURES, "budget_recall", "index_docs_per_s", "recall_p50_ms", "recall_p95_ms",
                  "tokens_returned", "tokens_naive", "token_savings"]
SWEEPABLE = ["embedder", "pooling", "query_prefix", "document_prefix", "dense_weight", "rrf_k", "top_k",
             "candidates", "max_tokens"]


def load_results(sweep_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """(one row per config, one row per config x query, the raw records) from a sweep or run dir."""
    sweep_dir = Path(sweep_dir)
    files = sorted(sweep_dir.glob("result.json")) + sorted(sweep_dir.glob("*/result.json"))
    if not files:
        raise ConfigError(f"No result.json under {sweep_dir}: pass a sweep directory (multirun/...) or a run directory.")
    records, per_query = [], []
    for file in files:
        record = json.loads(file.read_text(encoding="utf-8"))
        job = file.parent.name if file.parent != sweep_dir else "."
        record["row"]["job"] = job
        records.append(record)
        pq_file = file.parent / "per_query.csv"
        if pq_file.is_file():
            pq = pd.read_csv(pq_file, dtype={"query_id": str})
            pq.insert(0, "job", job)
            per_query.append(pq)
    rows = pd.DataFrame([r["row"] for r in records])
    first = [c for c in ["job", *KEY_COLUMNS, *RESULT_COLUMNS] if c in rows.columns]
    rows = rows[first + [c for c in rows.columns if c not in first]]
    return rows, (pd.concat(per_query, ignore_index=True) if per_query else pd.DataFrame()), records


def swept(rows: pd.DataFrame) -> dict[str, list]:
    return {c: rows[c].drop_duplicates().sort_values().tolist() for c in SWEEPABLE if c in rows and rows[c].nunique() > 1}


def _markdown(df: pd.DataFrame) -> str:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _invariance(rows: pd.DataFrame, weight: float, within: list[str]) -> str:
    """With one list's weight at zero, rrf_k cannot change the ranking; report whether it did."""
    part = rows[rows["dense_weight"] == weight]
    if part.empty or part["rrf_k"].nunique() < 2:
        return "not swept"
    spread = part.groupby(within)["ndcg@10"].agg(lambda s: s.max() - s.min()).max()
    return "yes" if spread < 1e-12 else f"NO (nDCG@10 varies by {spread:.4f} across rrf_k)"


def primary_metric(rows: pd.DataFrame) -> str:
    """Budget sweeps are judged by what the agent sees; ranking sweeps by nDCG@10."""
    return "budget_recall" if rows["max_tokens"].nunique() > 1 else "ndcg@10"


def write_plots(rows: pd.DataFrame, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    datasets = sorted(rows["dataset"].unique())

    fig = Figure(figsize=(6 * len(datasets), 4))
    axes = fig.subplots(1, len(datasets), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        part = rows[rows["dataset"] == name]
        for (embedder, k), group in part.groupby(["embedder", "rrf_k"]):
            group = group.groupby("dense_weight", as_index=False)["ndcg@10"].max()
            ax.plot(group["dense_weight"], group["ndcg@10"], marker="o", label=f"{embedder}, k={k:g}")
        ax.set(title=f"{name}: quality vs dense weight", xlabel="dense weight (0 = BM25 alone, 1 = dense alone)", ylabel="nDCG@10")
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "quality_vs_dense_weight.png"))

    fig = Figure(figsize=(6 * len(datasets), 4))
    axes = fig.subplots(1, len(datasets), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        part = rows[rows["dataset"] == name]
        for embedder, group in part.groupby("embedder"):
            ax.scatter(group["recall_p95_ms"], group["ndcg@10"], label=embedder, alpha=0.7)
        ax.set(title=f"{name}: quality vs latency", xlabel="recall p95 latency (ms, query embedding included)", ylabel="nDCG@10")
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "quality_vs_latency.png"))

    fig = Figure(figsize=(6 * len(datasets), 4))
    axes = fig.subplots(1, len(datasets), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        part = rows[rows["dataset"] == name]
        for (embedder, w, k), group in part.groupby(["embedder", "dense_weight", "rrf_k"]):
            group = group.sort_values("tokens_returned")
            ax.plot(group["tokens_returned"], group["budget_recall"], marker="o", label=f"{embedder}, w={w:g}, k={k:g}")
        ax.axvline(part["tokens_naive"].mean(), color="grey", linestyle="--", label="naive dump (mean)")
        ax.set(title=f"{name}: tokens vs recall within budget", xlabel="tokens returned per query (mean)", ylabel="recall within budget")
        ax.set_xscale("log")
        if part.groupby(["embedder", "dense_weight", "rrf_k"]).ngroups <= 12:
            ax.legend(fontsize=7)
    written.append(_save(fig, out / "tokens_vs_recall.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def build_report(sweep_dir: Path) -> Path:
    """(Re)build results.csv, per_query.csv, plots/ and report.md in ``sweep_dir``; returns report.md."""
    sweep_dir = Path(sweep_dir)
    rows, per_query, records = load_results(sweep_dir)
    rows.to_csv(sweep_dir / "results.csv", index=False)
    if not per_query.empty:
        per_query.to_csv(sweep_dir / "per_query.csv", index=False)
    plots = write_plots(rows, sweep_dir / "plots")
    metric = primary_metric(rows)
    best = rows.sort_values([metric, "recall_p95_ms"], ascending=[False, True]).groupby("dataset").head(1)
    shown = [c for c in ["job", "dataset", "embedder", "dense_weight", "rrf_k", "max_tokens", *RESULT_COLUMNS] if c in rows]
    env = records[0]["environment"]
    lines = [
        "# TinyContext evaluation report", "",
        f"{len(rows)} configs in `{sweep_dir}`, built {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.", "",
        "## What was swept", "",
        *([f"- `{k}`: {', '.join(map(str, v))}" for k, v in swept(rows).items()] or ["- nothing (a single config)"]), "",
        f"## Best config per dataset (by {metric}, then lower p95 latency)", "", _markdown(best[shown]), "",
        "## Checks", "",
        f"- dense_weight = 0 is BM25 alone (nDCG@10 independent of rrf_k and embedder): {_invariance(rows, 0.0, ['dataset', 'max_tokens', 'top_k', 'candidates'])}",
        f"- dense_weight = 1 is dense alone (nDCG@10 independent of rrf_k): {_invariance(rows, 1.0, ['dataset', 'embedder', 'max_tokens', 'top_k', 'candidates'])}",
        "",
    ]
    for name, part in rows.groupby("dataset"):
        lines += [f"## {name}", "", _markdown(part.sort_values(metric, ascending=False)[shown]), ""]
    lines += ["## Plots", "", *[f"![{p.stem}](plots/{p.name})" for p in plots], "",
              "## Environment", "",
              f"- CPU: {env.get('cpu')} ({env.get('cpu_affinity')} usable cores), Python {env.get('python')}, {env.get('platform')}",
              f"- load average at the first run: {env.get('load_average')}",
              "- packages: " + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v), "",
              ("Latency is measured with sweeps running side by side when the joblib launcher is used; compare"
               " latencies within one sweep, and re-run the chosen config alone for absolute numbers."), ""]
    report = sweep_dir / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def recommend(sweep_dir: Path, *, max_p95_ms: float | None = None, max_model_mb: float | None = None,
              metric: str | None = None, dataset: str | None = None, out: Path | None = None) -> tuple[Path, dict]:
    """Write the best config under the constraints as a context_config.json tinycontext loads as-is."""
    rows, _, _ = load_results(Path(sweep_dir))
    if dataset is not None:
        rows = rows[rows["dataset"] == dataset]
    elif rows["dataset"].nunique() > 1:
        raise ConfigError(f"The sweep covers several datasets ({', '.join(sorted(rows['dataset'].unique()))}); pass --dataset.")
    metric = metric or primary_metric(rows)
    # The engine's config has no pooling key: a config that overrides the model's pooling cannot be deployed.
    candidates = rows[rows["pooling"] == rows["model_pooling"]]
    if max_p95_ms is not None:
        candidates = candidates[candidates["recall_p95_ms"] <= max_p95_ms]
    if max_model_mb is not None:
        candidates = candidates[candidates["model_mb"] <= max_model_mb]
    if candidates.empty:
        raise ConfigError(
            f"No config meets p95 <= {max_p95_ms} ms and model <= {max_model_mb} MB (fastest p95: "
            f"{rows['recall_p95_ms'].min():.1f} ms, smallest model: {rows['model_mb'].min():.1f} MB). Relax a limit.")
    best = candidates.sort_values([metric, "recall_p95_ms"], ascending=[False, True]).iloc[0]
    settings = {
        "embedding_model": str(best["embedding_model"]),
        "recall_dense_weight": float(best["dense_weight"]),
        "recall_rrf_k": float(best["rrf_k"]),
        "recall_top_k": int(best["top_k"]),
        "recall_max_tokens": int(best["max_tokens"]),
        "recall_candidates": int(best["candidates"]),
        "dense_query_prefix": "" if pd.isna(best["query_prefix"]) else str(best["query_prefix"]),
        "dense_document_prefix": "" if pd.isna(best["document_prefix"]) else str(best["document_prefix"]),
    }
    out = Path(out) if out else Path(sweep_dir) / "context_config.json"
    out.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    load_config(out, env={})  # fails loudly (config_error) if tinycontext would not accept the file
    summary = {"job": best["job"], "metric": metric, "value": float(best[metric]), "recall_p95_ms": float(best["recall_p95_ms"]),
               "model_mb": float(best["model_mb"]), "settings": settings}
    return out, summary

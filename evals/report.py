"""Aggregate a sweep directory into results.csv, per_query.csv, report.md and PNG plots (drawn by
:mod:`.plots`); choose a config on the tuning split and report it on the test split (``recommend``).
Comparing two runs is :mod:`.compare`; naming configs and their axes is :mod:`.configs`.

Statistics (per dataset, on the tuning split's per-query scores of the primary metric): the best
config by mean, a paired t-test of every config against the best and against the default config
(the engine's shipped settings), Holm-corrected across the sweep; configs whose corrected p-value
against the best is >= 0.05 are tied with it. ``recommend`` keeps the default when it is tied with
the best (no evidence to change it), else takes the best.
"""

from __future__ import annotations

import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from tinycontext import ConfigError, load_config

from .configs import label, primary_metric, swept
from .plots import write_plots
from .records import TamperedError, derive, job_files, qrels_file, run_file, splits_of, verify
from .stats import MARGIN, RESAMPLES, bootstrap_ci, holm, paired_p, summary, tost_p

ALPHA = 0.05
PER_QUERY_TYPES = {"query_id": str, "retrieved": str, "received": str, "relevant": str, "session": str}
KEY_COLUMNS = ["dataset", "embedder", "pooling", "query_prefix", "document_prefix", "dense_weight", "rrf_k",
               "top_k", "candidates", "max_tokens"]
RESULT_COLUMNS = ["tune_ndcg@10", "ndcg@10", "ndcg@10_ci_low", "ndcg@10_ci_high", "recall@5", "recall@10", "recall@10_ci_low",
                  "recall@10_ci_high", "recall@100", "mrr@10", "budget_recall", "recall_p50_ms", "recall_p95_ms",
                  "recall_p99_ms", "peak_rss_mb", "index_docs_per_s", "tokens_returned", "tokens_per_request", "tokens_naive",
                  "token_savings"]
STAT_COLUMNS = ["is_best", "tied_with_best", "equivalent_to_best", "p_vs_best", "p_vs_best_holm", "tost_vs_best",
                "tost_vs_best_holm", "p_vs_default", "p_vs_default_holm", "tost_vs_default", "tost_vs_default_holm", "margin"]


def load_results(sweep_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """(one row per config, one row per config x query, the raw records) from a sweep or run dir.

    Nothing stored is taken on trust: each job's record and files are checked against its content
    hash, its quality figures are scored again from its TREC run files and qrels, and its summary row
    is derived from the per-query values (``evals.records``); an edited job is refused by name."""
    sweep_dir = Path(sweep_dir)
    files = sorted(sweep_dir.glob("result.json")) + sorted(sweep_dir.glob("*/result.json"))
    if not files:
        raise ConfigError(f"No result.json under {sweep_dir}: pass a sweep directory (multirun/...) or a run directory.")
    records, rows, per_query = [], [], []
    for file in files:
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            record["row"]  # noqa: B018 (a record without a row is not one the harness wrote)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TamperedError(f"{file} is not a readable job record ({type(exc).__name__}: {exc}); delete the job "
                                "directory and run it again.", where=str(file)) from exc
        blobs = job_files(file.parent)
        verify(record, blobs, str(file))
        splits = splits_of(record)
        pq = pd.read_csv(io.BytesIO(blobs["per_query.csv"]), dtype=PER_QUERY_TYPES)
        row, pq = derive(record, pq, {s: blobs[run_file(s)].decode() for s in splits},
                         {s: blobs[qrels_file(s)].decode() for s in splits}, str(file))
        job = file.parent.name if file.parent != sweep_dir else "."
        row["job"] = job
        record["row"] = row
        records.append(record)
        rows.append(row)
        pq.insert(0, "job", job)
        per_query.append(pq)
    rows = pd.DataFrame(rows)
    first = [c for c in ["job", *KEY_COLUMNS, *RESULT_COLUMNS] if c in rows.columns]
    rows = rows[first + [c for c in rows.columns if c not in first]]
    return rows, pd.concat(per_query, ignore_index=True), records


def _markdown(df: pd.DataFrame) -> str:
    def cell(v):
        if isinstance(v, (bool, np.bool_)):
            return "yes" if v else ""
        return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v).replace("|", "\\|")

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


def split_matrix(per_query: pd.DataFrame, jobs, metric: str, split: str = "tune") -> pd.DataFrame:
    """queries x jobs of one metric on one split (queries every job scored)."""
    part = per_query[per_query["job"].isin(list(jobs)) & per_query[split].astype(bool)]
    return part.pivot_table(index="query_id", columns="job", values=metric, aggfunc="first").dropna()


def sweep_stats(matrix: pd.DataFrame, default_job: str | None, margin: float = MARGIN) -> pd.DataFrame:
    """Per job: is_best; superiority (paired t-test) and equivalence (paired TOST within ``margin``)
    against the best and the default, raw and Holm-corrected across the sweep; tied_with_best (not
    significantly different) and equivalent_to_best (significantly within the margin)."""
    means = matrix.mean()
    best = means.idxmax()
    out = pd.DataFrame(index=matrix.columns)
    out["is_best"] = out.index == best
    for ref, name in ((best, "best"), (default_job, "default")):
        if ref is None or ref not in matrix:
            out[f"p_vs_{name}"] = out[f"tost_vs_{name}"] = np.nan
        else:
            out[f"p_vs_{name}"] = [np.nan if j == ref else paired_p(matrix[j], matrix[ref]) for j in matrix.columns]
            out[f"tost_vs_{name}"] = [np.nan if j == ref else tost_p(matrix[j], matrix[ref], margin) for j in matrix.columns]
        out[f"p_vs_{name}_holm"] = holm(out[f"p_vs_{name}"].to_numpy())
        out[f"tost_vs_{name}_holm"] = holm(out[f"tost_vs_{name}"].to_numpy())
    out["tied_with_best"] = out["is_best"] | (out["p_vs_best_holm"] >= ALPHA)
    out["equivalent_to_best"] = out["is_best"] | (out["tost_vs_best_holm"] < ALPHA)
    out["margin"] = margin
    return out


# Cost axes of the pick among equivalent configs, in the order that breaks ties on the front.
COSTS = ["model_mb", "tokens_returned", "recall_p95_ms", "peak_rss_mb"]


def cost_table(rows: pd.DataFrame, per_query: pd.DataFrame) -> pd.DataFrame:
    """Per job: model size, tokens returned (mean over the tuning split), p95 latency (NaN when every
    timing pass ran under external load: not a figure to decide on) and peak RSS."""
    table = rows.set_index("job")[[c for c in ("model_mb", "recall_p95_ms", "peak_rss_mb") if c in rows]].astype(float)
    if "latency_flagged" in rows:
        table.loc[rows.set_index("job")["latency_flagged"].astype(bool), "recall_p95_ms"] = np.nan
    tune = per_query[per_query["tune"].astype(bool)]
    table["tokens_returned"] = tune.groupby("job")["tokens_returned"].mean().reindex(table.index)
    return table[[c for c in COSTS if c in table]]


def _dominates(a: pd.Series, b: pd.Series) -> bool:
    known = a.notna() & b.notna()
    return bool(known.any() and (a[known] <= b[known]).all() and (a[known] < b[known]).any())


def cost_front(costs: pd.DataFrame) -> list[str]:
    """Jobs no other job of ``costs`` is at least as cheap as on every known axis and cheaper on one."""
    return [j for j in costs.index if not any(_dominates(costs.loc[o], costs.loc[j]) for o in costs.index if o != j)]


def decision(matrix: pd.DataFrame, default_job: str | None, costs: pd.DataFrame | None = None, margin: float = MARGIN) -> dict:
    """The pick on this split, and the rule that made it:

    1. the configs equivalent to the best (TOST within ``margin``, Holm-corrected), the best included;
    2. of these, the cost front: none is matched or beaten on every cost (model size, tokens, p95
       latency measured without external load, peak RSS) by another equivalent config;
    3. the default config when it is on that front (no cheaper equivalent config to move to), else the
       front's cheapest by model size, then tokens, then p95, then RSS, then quality.
    Without costs, the default when equivalent to the best, else the best."""
    stats = sweep_stats(matrix, default_job, margin)
    best = str(stats.index[stats["is_best"]][0])
    equivalent = [str(j) for j in stats.index[stats["equivalent_to_best"]]]
    if costs is None or costs.empty:
        front = equivalent
    else:
        front = cost_front(costs.reindex(equivalent))
    if default_job is not None and default_job in front:
        job, rule = default_job, ("default kept: equivalent to the best (TOST, margin {m}) and no equivalent config is "
                                  "cheaper on every cost")
    elif len(equivalent) == 1:
        job, rule = best, "best: no other config is equivalent to it (TOST, margin {m})"
    else:
        means = matrix.mean()
        order = costs.reindex(front).assign(_q=-means.reindex(front)) if costs is not None else pd.DataFrame({"_q": -means[front]})
        job = str(order.sort_values(list(order.columns), na_position="last").index[0])
        rule = ("cost: the cheapest (model size, then tokens, p95, RSS) of the configs equivalent to the best "
                "(TOST, margin {m}) on the cost front")
    return {"job": job, "rule": rule.format(m=f"{margin:g}"), "best": best, "equivalent": equivalent, "front": front,
            "margin": margin}


def choose(matrix: pd.DataFrame, default_job: str | None, costs: pd.DataFrame | None = None, margin: float = MARGIN) -> str:
    """The job :func:`decision` picks."""
    return decision(matrix, default_job, costs, margin)["job"]


def default_job(rows: pd.DataFrame) -> str | None:
    hits = rows[rows["is_default"].astype(bool)] if "is_default" in rows else rows.iloc[0:0]
    return str(hits["job"].iloc[0]) if len(hits) else None


def cross_validated(per_query: pd.DataFrame, rows: pd.DataFrame, metric: str) -> dict:
    """Leave-one-session-out estimate of the test score of ``choose``: choose on the other sessions'
    queries, score the choice on the held-out session's, pool the held-out scores."""
    matrix = split_matrix(per_query, rows["job"], metric)
    sessions = per_query.drop_duplicates("query_id").set_index("query_id")["session"].reindex(matrix.index)
    default, costs = default_job(rows), cost_table(rows, per_query)
    held_out, folds = [], []
    for session in sorted(sessions.dropna().unique()):
        inside = sessions == session
        job = choose(matrix[~inside], default, costs)
        held_out.append(matrix.loc[inside, job])
        folds.append({"held_out": session, "chosen": job, "queries": int(inside.sum())})
    scores = pd.concat(held_out) if held_out else pd.Series(dtype=float)
    low, high = bootstrap_ci(scores.to_numpy())
    return {"value": float(scores.mean()), "ci_low": low, "ci_high": high, "queries": len(scores), "folds": folds}


def dataset_stats(rows: pd.DataFrame, per_query: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``rows`` of one dataset with STAT_COLUMNS added (tuning split of ``metric``)."""
    matrix = split_matrix(per_query, rows["job"], metric)
    stats = sweep_stats(matrix, default_job(rows))
    return rows.drop(columns=[c for c in STAT_COLUMNS if c in rows]).join(stats, on="job")


def _fmt_ci(row, name: str, digits: int = 4) -> str:
    return f"{row[name]:.{digits}f} [{row[f'{name}_ci_low']:.{digits}f}, {row[f'{name}_ci_high']:.{digits}f}]"


def _category_table(part: pd.DataFrame, jobs: list[str]) -> list[str]:
    cats = sorted({c.split("_")[0] for c in part.columns if c.startswith("cat") and c.endswith("_queries")})
    if not cats:
        return []
    lines = ["LoCoMo categories 1-4 (test = dev split; category 5, adversarial questions about things that never",
             "happened, has no answer and is excluded). R@5, R@10 and recall within the budget with 95% CIs:", ""]
    table = []
    for job in jobs:
        row = part[part["job"] == job].iloc[0]
        for cat in cats:
            table.append({"job": job, "category": cat[3:], "queries": int(row[f"{cat}_queries"]),
                          "R@5": _fmt_ci(row, f"{cat}_recall@5"), "R@10": _fmt_ci(row, f"{cat}_recall@10"), "nDCG@10": _fmt_ci(row, f"{cat}_ndcg@10"),
                          "budget recall": _fmt_ci(row, f"{cat}_budget_recall")})
    return [*lines, _markdown(pd.DataFrame(table)), ""]


def build_report(sweep_dir: Path) -> Path:
    """(Re)build results.csv, per_query.csv, plots/ and report.md in ``sweep_dir``; returns report.md."""
    sweep_dir = Path(sweep_dir)
    rows, per_query, records = load_results(sweep_dir)
    parts, chosen, sections = [], {}, []
    axes = list(swept(rows))
    for name, part in rows.groupby("dataset"):
        metric = primary_metric(part)
        part = dataset_stats(part, per_query, metric)
        parts.append(part)
        matrix = split_matrix(per_query, part["job"], metric)
        pick = decision(matrix, default_job(part), cost_table(part, per_query))
        chosen[name] = pick["job"]
        sections += _dataset_section(name, part, per_query, metric, pick, axes)
    rows = pd.concat(parts)
    rows.to_csv(sweep_dir / "results.csv", index=False)
    if not per_query.empty:
        per_query.to_csv(sweep_dir / "per_query.csv", index=False)
    plots = write_plots(rows, sweep_dir / "plots", chosen)
    env = records[0]["manifest"]
    reused = sum(1 for r in records if r.get("reused_run"))
    flagged = rows[rows["latency_flagged"].astype(bool)] if "latency_flagged" in rows else rows.iloc[0:0]
    tuned_on_test = rows[rows["tuned_on_test"].astype(bool)] if "tuned_on_test" in rows else rows.iloc[0:0]
    lines = [
        "# TinyContext evaluation report", "",
        *([f"**TUNED ON TEST (allow_test_tuning=true): {len(tuned_on_test)} configs were chosen on the split they are "
           "reported on; their test figures are optimistic.**", ""] if len(tuned_on_test) else []),
        f"{len(rows)} configs in `{sweep_dir}`, built {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        + (f" ({reused} taken from the results store: finished before with the same config, data, model and code)." if reused else "."),
        "",
        "## What was swept", "",
        *([f"- `{k}`: {', '.join(map(str, v))}" for k, v in swept(rows).items()] or ["- nothing (a single config)"]), "",
        "Configs are chosen on the tuning split and reported on the test split. CIs are paired-bootstrap 95% intervals over",
        f"queries ({RESAMPLES:,} resamples). Superiority: paired t-tests on the tuning split, Holm-corrected across the sweep;",
        f"`tied` = not distinguishable from the best (corrected p >= {ALPHA}). Equivalence: paired TOST with margin",
        f"{MARGIN:g} (absolute, in the metric's units), Holm-corrected; `equivalent` = within the margin of the best with",
        "95% confidence. The pick among equivalent configs is by cost on a Pareto front of model size, tokens returned, p95",
        "latency (timing passes without external load only) and peak RSS; each dataset's section names the rule that chose.",
        "Every figure here was derived at report time from the stored per-query rankings (TREC run files) and qrels, after",
        "each job's content hash was checked.", "",
        "## Checks", "",
        f"- dense_weight = 0 is BM25 alone (nDCG@10 independent of rrf_k and embedder): {_invariance(rows, 0.0, ['dataset', 'max_tokens', 'top_k', 'candidates'])}",
        f"- dense_weight = 1 is dense alone (nDCG@10 independent of rrf_k): {_invariance(rows, 1.0, ['dataset', 'embedder', 'max_tokens', 'top_k', 'candidates'])}",
        "", *sections,
        "## Plots", "", *[f"![{p.stem}](plots/{p.name})" for p in plots], "",
        "## Environment", "",
        f"- CPU: {env.get('cpu')} ({env.get('cpu_affinity')} usable cores), Python {env.get('python')}, {env.get('platform')}",
        f"- git: {env.get('git', {}).get('commit')} (dirty: {env.get('git', {}).get('dirty')})",
        "- load during the timing passes (1-min load average, competing cores): "
        + "; ".join(f"{r['row']['job']}: " + ", ".join(f"{p['load1_before']}/{p['competing_cores']:.2f}{'*' if p['loaded'] else ''}"
                                                      for p in r.get('latency', {}).get('passes', []))
                    for r in records[:10]) + (" ..." if len(records) > 10 else "") + " (* = under external load, excluded)",
        *([f"- **latency flagged** (every timing pass ran under external load beyond "
           f"{records[0].get('latency', {}).get('max_competing_cores')} competing cores; excluded from --max-p95-ms and "
           f"the cost pick): jobs {', '.join(map(str, flagged['job']))}"] if len(flagged) else []),
        "- packages: " + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v), "",
        ("Latency: live `MemoryEngine.recall` calls (query embedding included) after a warm-up, in repeated passes, one job"
         " timing at a time on the host, the load sampled during each pass; p50/p95 with bootstrap CIs over the passes run"
         " without external load. Indexing throughput and peak RSS from a fresh process per model (an embedding server's"
         " own memory is not in it)."), "",
    ]
    report = sweep_dir / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def _dataset_section(name: str, part: pd.DataFrame, per_query: pd.DataFrame, metric: str, pick: dict, axes: list[str]) -> list[str]:
    best = part[part["is_best"]].iloc[0]
    chosen_row = part[part["job"] == pick["job"]].iloc[0]
    tune_split, test_split = chosen_row["tune_split"], chosen_row["test_split"]
    lines = [f"## {name}", "",
             f"Tuning split `{tune_split}` ({int(chosen_row['queries_tune'])} queries), test split `{test_split}` "
             f"({int(chosen_row['queries_test'])} queries); judged by {metric}."
             + (" **Tuned on test.**" if chosen_row.get("tuned_on_test") else ""), "",
             f"- **recommended**: job {pick['job']} ({label(chosen_row, axes)}): {tune_split} {_fmt_ci(chosen_row, 'tune_' + metric)}, "
             f"{test_split} {_fmt_ci(chosen_row, metric)}; p95 {_fmt_ci(chosen_row, 'recall_p95_ms', 1)} ms"
             + (" (flagged: measured under load)" if chosen_row.get("latency_flagged") else ""),
             f"- rule that chose: {pick['rule']}",
             f"- best on the tuning split: job {best['job']} ({label(best, axes)}): {_fmt_ci(best, 'tune_' + metric)}; "
             f"{int(part['tied_with_best'].sum())} configs tied with it (not significantly different), "
             f"{len(pick['equivalent'])} equivalent to it within {pick['margin']:g} (TOST); on the cost front of those: "
             + ", ".join(f"{j} ({label(part[part['job'] == j].iloc[0], axes)})" for j in pick["front"])]
    if chosen_row.get("cross_validate") == "session":
        cv = cross_validated(per_query[per_query["job"].isin(part["job"])], part, metric)
        lines.append(f"- test estimate of this choice (leave-one-conversation-out): {cv['value']:.4f} "
                     f"[{cv['ci_low']:.4f}, {cv['ci_high']:.4f}] over {cv['queries']} queries")
    default = default_job(part)
    if default is not None:
        d = part[part["job"] == default].iloc[0]
        lines.append(f"- default (shipped) config: job {default}: {tune_split} {_fmt_ci(d, 'tune_' + metric)}, "
                     f"{test_split} {_fmt_ci(d, metric)}")
    lines.append("")
    shown = [c for c in ["job", *axes, f"tune_{metric}", f"tune_{metric}_ci_low", f"tune_{metric}_ci_high", metric,
                         f"{metric}_ci_low", f"{metric}_ci_high", "recall@5", "recall@10", "budget_recall", "tokens_returned",
                         "tokens_per_request", "tokens_naive", "recall_p50_ms", "recall_p95_ms", "recall_p95_ms_ci_low",
                         "recall_p95_ms_ci_high", "latency_flagged", "peak_rss_mb", "model_mb", "p_vs_default_holm",
                         "p_vs_best_holm", "tied_with_best", "tost_vs_best_holm", "equivalent_to_best"] if c in part]
    shown = list(dict.fromkeys(shown))
    lines += [_markdown(part.sort_values(f"tune_{metric}", ascending=False)[shown]), "",
              "Budget cost: `recall@10` is R@10 of the unlimited ranking, `budget_recall` what fits the token budget "
              "(top_k, max_tokens); `tokens_per_request` adds the MCP tool definitions every request carries "
              "(`schema_tokens`, the `tools` profile); `tokens_naive` is the fixed baseline (BM25's top 10 in full, or the whole conversation).", ""]
    lines += _category_table(part, list(dict.fromkeys([pick["job"], *([default] if default else [])])))
    return lines


def recommend(sweep_dir: Path, *, max_p95_ms: float | None = None, max_model_mb: float | None = None,
              metric: str | None = None, dataset: str | None = None, out: Path | None = None) -> tuple[Path, dict]:
    """Choose on the tuning split under the constraints; write the choice and its test score as a
    context_config.json tinycontext loads as-is (the scores sit under ``provenance``)."""
    rows, per_query, records = load_results(Path(sweep_dir))
    if dataset is not None:
        rows = rows[rows["dataset"] == dataset]
    elif rows["dataset"].nunique() > 1:
        raise ConfigError(f"The sweep covers several datasets ({', '.join(sorted(rows['dataset'].unique()))}); pass --dataset.")
    metric = metric or primary_metric(rows)
    # The engine's config has no pooling key: a config that overrides the model's pooling cannot be deployed.
    candidates = rows[rows["pooling"] == rows["model_pooling"]]
    if max_p95_ms is not None:
        # A p95 measured under external load decides nothing: such configs are left out, and said so.
        flagged = candidates["latency_flagged"].astype(bool) if "latency_flagged" in candidates else False
        candidates = candidates[~flagged & (candidates["recall_p95_ms"] <= max_p95_ms)]
    if max_model_mb is not None:
        candidates = candidates[candidates["model_mb"] <= max_model_mb]
    if candidates.empty:
        raise ConfigError(
            f"No config meets p95 <= {max_p95_ms} ms and model <= {max_model_mb} MB (fastest p95: "
            f"{rows['recall_p95_ms'].min():.1f} ms, smallest model: {rows['model_mb'].min():.1f} MB; configs whose every "
            f"timing pass ran under external load: {int(rows.get('latency_flagged', pd.Series(dtype=bool)).astype(bool).sum())}, "
            "never counted as meeting a latency limit). Relax a limit, or time on a quieter machine.")
    matrix = split_matrix(per_query, candidates["job"], metric)
    pick = decision(matrix, default_job(candidates), cost_table(candidates, per_query))
    job = pick["job"]
    best = candidates[candidates["job"] == job].iloc[0]
    out = Path(out) if out else Path(sweep_dir) / "context_config.json"
    record = next(r for r in records if r["row"]["job"] == job)
    settings = {
        **portable_model(record["model"].get("engine_fields") or {"embedding_model": str(best["embedding_model"])}, out),
        "recall_dense_weight": float(best["dense_weight"]),
        "recall_rrf_k": float(best["rrf_k"]),
        "recall_top_k": int(best["top_k"]),
        "recall_max_tokens": int(best["max_tokens"]),
        "recall_candidates": int(best["candidates"]),
        "dense_query_prefix": "" if pd.isna(best["query_prefix"]) else str(best["query_prefix"]),
        "dense_document_prefix": "" if pd.isna(best["document_prefix"]) else str(best["document_prefix"]),
        # Engine settings a sweep passed through (engine.index.* / engine.recall.*) are part of the choice.
        **{c.split(".")[-1]: _plain(best[c]) for c in best.index if c.startswith("engine.") and not pd.isna(best[c])},
    }
    tune = per_query[(per_query["job"] == job) & per_query["tune"].astype(bool)][metric].to_numpy()
    test = per_query[(per_query["job"] == job) & per_query["test"].astype(bool)][metric].to_numpy()
    provenance = {
        "sweep": str(Path(sweep_dir).resolve()), "job": str(job), "dataset": str(best["dataset"]), "metric": metric,
        "chosen_on": {"split": str(best["tune_split"]), **summary(tune, "value"), "queries": int(len(tune))},
        "test": {"split": str(best["test_split"]), **summary(test, "value"), "queries": int(len(test))},
        "recall_p95_ms": float(best["recall_p95_ms"]), "latency_flagged": bool(best.get("latency_flagged", False)),
        "model_mb": float(best["model_mb"]), "rule": pick["rule"], "equivalent": pick["equivalent"], "cost_front": pick["front"],
        "margin": pick["margin"], "tuned_on_test": bool(best.get("tuned_on_test", False)),
    }
    if best.get("cross_validate") == "session":
        cv = cross_validated(per_query[per_query["job"].isin(candidates["job"])], candidates, metric)
        provenance["test"] = {"split": f"{best['test_split']} (leave-one-conversation-out)", **cv}
    out.write_text(json.dumps({**settings, "provenance": provenance}, indent=2) + "\n", encoding="utf-8")
    load_config(out, env={})  # fails loudly (config_error) if tinycontext would not accept the file
    summary_out = {"job": str(job), "metric": metric, "rule": pick["rule"], "tuned_on_test": provenance["tuned_on_test"],
                   "tune": provenance["chosen_on"], "test": provenance["test"], "recall_p95_ms": float(best["recall_p95_ms"]),
                   "model_mb": float(best["model_mb"]), "settings": settings}
    return out, summary_out


def portable_model(fields: dict, out: Path) -> dict:
    """The embedding settings of a choice as a config file can carry anywhere: a bundle folder as a path
    relative to the file (``load_config`` resolves it against the file), names and servers as they are."""
    fields = dict(fields)
    model = fields.get("embedding_model", "")
    if Path(model).is_absolute():
        fields["embedding_model"] = "./" + Path(os.path.relpath(model, Path(out).resolve().parent)).as_posix()
    fields.pop("embedding_batch_size", None)
    return {k: v for k, v in fields.items() if v not in ("", {}, None)}


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def calibrate_floor(run_dir: Path, keep: float = 0.95) -> dict:
    """A relevance floor for the run's embedding model, from its own data: the dense cosine below which
    only ``1 - keep`` of the tuning split's queries have their best relevant document (the floor keeps
    the rest reachable by dense search alone), and how many queries' best unrelated document it
    stops. Set it as ``embedding_min_dense`` (a server), ``min_dense`` in a bundle's
    model_config.json, or ``recall_min_dense``."""
    _, per_query, records = load_results(Path(run_dir))
    if "dense_relevant_max" not in per_query:
        raise ConfigError(f"{run_dir} has no dense scores per query: run it again with this harness.")
    tune = per_query[per_query["tune"].astype(bool)]
    relevant, other = tune["dense_relevant_max"].dropna().to_numpy(float), tune["dense_other_max"].dropna().to_numpy(float)
    if relevant.size == 0:
        raise ConfigError(f"{run_dir}: no relevant document was in any dense candidate list; nothing to calibrate on.")
    floor = float(np.quantile(relevant, 1 - keep))
    return {"model": records[0]["row"]["model"], "min_dense": round(floor, 4), "keep": keep, "queries": int(relevant.size),
            "relevant_best_median": float(np.median(relevant)), "other_best_median": float(np.median(other)) if other.size else None,
            "other_best_below_floor": float((other < floor).mean()) if other.size else None,
            "split": str(records[0]["row"]["tune_split"])}

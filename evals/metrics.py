"""Quality metrics (ir-measures) and token/latency summaries."""

from __future__ import annotations

from collections.abc import Iterable

import ir_measures
import numpy as np
from ir_measures import RR, R, nDCG

# Column name in results.csv -> ir-measures measure. MRR@10 is ir-measures' RR@10 averaged.
MEASURES = {"ndcg@10": nDCG @ 10, "recall@5": R @ 5, "recall@10": R @ 10, "recall@100": R @ 100, "mrr@10": RR @ 10}


def per_query_quality(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{qid: {measure name: value}} for every judged query.

    pytrec_eval skips queries that are missing from the run; a judged query with nothing
    retrieved scores 0 here, as it should.
    """
    names = {str(m): name for name, m in MEASURES.items()}
    judged = [q for q, rels in qrels.items() if any(r > 0 for r in rels.values())]
    out = {q: dict.fromkeys(MEASURES, 0.0) for q in judged}
    run = {q: docs for q, docs in run.items() if q in out and docs}
    for metric in ir_measures.iter_calc(list(MEASURES.values()), {q: qrels[q] for q in judged}, run):
        out[metric.query_id][names[str(metric.measure)]] = float(metric.value)
    return out


def mean_quality(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    return {name: float(np.mean([v[name] for v in per_query.values()])) if per_query else 0.0 for name in MEASURES}


def recall_within(retrieved: Iterable[str], relevant: dict[str, int]) -> float:
    """Share of the relevant documents among those the agent actually received."""
    wanted = {d for d, r in relevant.items() if r > 0}
    return len(wanted & set(retrieved)) / len(wanted) if wanted else 0.0


def latency_summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"recall_p50_ms": 0.0, "recall_p95_ms": 0.0, "recall_p99_ms": 0.0, "recall_mean_ms": 0.0}
    arr = np.asarray(ms)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"recall_p50_ms": float(p50), "recall_p95_ms": float(p95), "recall_p99_ms": float(p99), "recall_mean_ms": float(arr.mean())}


def token_summary(returned: list[int], naive: list[int], schema_tokens: int = 0) -> dict[str, float]:
    """Mean tokens of the answers and of the naive baseline; ``schema_tokens`` (the MCP tool definitions every
    request also carries) gives the per-request cost an agent pays, schema + answer."""
    total_returned, total_naive = float(sum(returned)), float(sum(naive))
    mean_returned = total_returned / len(returned) if returned else 0.0
    return {
        "tokens_returned": mean_returned,
        "schema_tokens": float(schema_tokens),
        "tokens_per_request": schema_tokens + mean_returned,
        "tokens_naive": total_naive / len(naive) if naive else 0.0,
        # Percent of the naive dump's tokens the agent does not have to read.
        "token_savings": 100.0 * (1.0 - total_returned / total_naive) if total_naive else 0.0,
    }

"""Comparing two runs: paired per-query differences B - A per split (mean, 95% CI, p, wins and
losses). Either side may be a harness run (a run directory or a run id in the results store, checked
and re-derived as the report does) or any TREC run file, scored on the other side's qrels."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tinycontext import ConfigError

from .metrics import MEASURES
from .records import derive, qrels_file, read_run, run_file, splits_of
from .report import load_results
from .stats import diff_ci, paired_p


def _run_scores(ref: str, store_path: Path | None) -> tuple[str, pd.DataFrame | dict, dict[str, str]]:
    """(name, per-query scores, {split: TREC qrels text}) of a harness run (a run directory or a run id
    in the results store, checked and re-derived as the report does), or (name, {qid: {doc: score}},
    {}) of any TREC run file (another system's), to be scored with the other side's qrels."""
    path = Path(ref)
    if (path / "result.json").is_file():
        _, per_query, records = load_results(path)
        folder = path
        return str(path), per_query.drop(columns="job"), {s: (folder / qrels_file(s)).read_text(encoding="utf-8")
                                                          for s in splits_of(records[0])}
    if path.is_file():
        try:
            return f"TREC run {path}", read_run(path.read_text(encoding="utf-8")), {}
        except (ValueError, IndexError) as exc:
            raise ConfigError(f"{path} is not a TREC run file (qid Q0 docid rank score tag): {exc}", path=str(path)) from exc
    if store_path is not None and store_path.is_file():
        from .store import ResultsStore

        with ResultsStore(store_path) as store:
            hit = store.get(ref)
        if hit is not None:
            record, per_query, files = hit
            splits = splits_of(record)
            qrels = {s: files[qrels_file(s)].decode() for s in splits}
            _, per_query = derive(record, per_query, {s: files[run_file(s)].decode() for s in splits}, qrels, f"run {ref}")
            return f"run {ref}", per_query, qrels
    raise ConfigError(f"{ref} is neither a run directory, a TREC run file nor a run id in the results store {store_path}.")


def _score_trec(run: dict, qrels: dict[str, str], splits: dict[str, str]) -> pd.DataFrame:
    """Per-query quality of a foreign TREC run on the harness run's qrels (split name -> tune/test)."""
    from .metrics import per_query_quality
    from .records import read_qrels

    rows = []
    for split, text in qrels.items():
        judged = read_qrels(text)
        for qid, scores in per_query_quality(judged, {q: d for q, d in run.items() if q in judged}).items():
            rows.append({"query_id": qid, **{flag: name == split for flag, name in splits.items()}, **scores})
    return pd.DataFrame(rows).groupby("query_id", as_index=False).agg(
        {"tune": "max", "test": "max", **{m: "first" for m in MEASURES}})


def _split_name(qrels: dict[str, str], per_query: pd.DataFrame, flag: str) -> str | None:
    """Which split's qrels hold the queries a harness run flags ``tune``/``test``."""
    from .records import read_qrels

    wanted = set(per_query.loc[per_query[flag].astype(bool), "query_id"])
    return next((s for s, text in qrels.items() if wanted and wanted <= set(read_qrels(text))), None)


def compare(run_a: str, run_b: str, *, store_path: Path | None = None, metrics: list[str] | None = None) -> pd.DataFrame:
    """Paired per-query differences B - A on the queries both runs scored, per split: mean, 95% CI, p.
    Either side may be any TREC run file: it is scored with ir_measures on the other side's qrels."""
    name_a, a, qrels_a = _run_scores(run_a, store_path)
    name_b, b, qrels_b = _run_scores(run_b, store_path)
    if isinstance(a, dict) and isinstance(b, dict):
        raise ConfigError("Compare a TREC run with a harness run (a run directory or store id): its qrels score the TREC run.")
    sides = []
    for scores, other, own_qrels, other_qrels in ((a, b, qrels_a, qrels_b), (b, a, qrels_b, qrels_a)):
        if isinstance(scores, dict):
            splits = {flag: _split_name(other_qrels, other, flag) for flag in ("tune", "test")}
            scores = _score_trec(scores, other_qrels, splits)
        sides.append(scores)
    a, b = sides
    metrics = metrics or ([*MEASURES, "budget_recall"] if "budget_recall" in a and "budget_recall" in b else list(MEASURES))
    out = []
    for split in ("tune", "test"):
        left = a[a[split].astype(bool)].set_index("query_id") if split in a else a.set_index("query_id")
        right = b[b[split].astype(bool)].set_index("query_id") if split in b else b.set_index("query_id")
        common = left.index.intersection(right.index)
        if common.empty:
            continue
        for metric in metrics:
            x, y = left.loc[common, metric].to_numpy(float), right.loc[common, metric].to_numpy(float)
            low, high = diff_ci(y, x)
            out.append({"split": split, "metric": metric, "queries": len(common), "a": x.mean(), "b": y.mean(),
                        "b_minus_a": (y - x).mean(), "ci_low": low, "ci_high": high, "p": paired_p(y, x),
                        "wins": int((y > x).sum()), "losses": int((y < x).sum())})
    if not out:
        raise ConfigError(f"{name_a} and {name_b} share no scored query: compare runs on the same dataset.")
    return pd.DataFrame(out)

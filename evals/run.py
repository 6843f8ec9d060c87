"""Entry point: ``python -m evals.run`` / ``tinycontext-eval``.

- ``tinycontext-eval [hydra overrides]``: one run, or a sweep with ``-m`` or an ``experiment=`` preset.
- ``tinycontext-eval report <sweep dir>``: (re)build results.csv, report.md and plots.
- ``tinycontext-eval recommend <sweep dir> [--max-p95-ms X] [--max-model-mb Y]``: choose on the tuning
  split, write context_config.json with the choice and its test score.
- ``tinycontext-eval compare RUN_A RUN_B``: paired per-query differences with CIs (run dirs, store ids, or any
  TREC run file, scored on the other side's qrels).
- ``tinycontext-eval calibrate-floor <run dir> [--keep 0.95]``: a relevance floor for the run's model.
- ``tinycontext-eval ingest <sweep dir>``: append a sweep's results to the local results store.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from tinycontext import TinyContextConfig, TinyContextError

log = logging.getLogger("evals")
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per embedding request would drown the log


def _engine_default(name: str):
    """``${tc_default:recall_rrf_k}``: the engine's own default, so configs track engine tuning."""
    value = TinyContextConfig.model_fields[name].get_default(call_default_factory=True)
    return str(value) if isinstance(value, Path) else value


OmegaConf.register_new_resolver("tc_default", _engine_default, replace=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from .callbacks import record_progress
    from .runner import run_config

    started = time.perf_counter()
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    record = run_config(cfg, Path(hc.runtime.output_dir), overrides=list(hc.overrides.task),
                        sweep_dir=Path(hc.sweep.dir) if multirun else None)
    row = record["row"]
    log.info("%s | %s | w=%g k=%g budget=%d: nDCG@10 %s %.4f [%.4f, %.4f], %s %.4f; budget recall %.3f, p95 %.1f ms, "
             "tokens %.0f vs %.0f naive", row["dataset"], row["embedder"], row["dense_weight"], row["rrf_k"], row["max_tokens"],
             row["test_split"], row["ndcg@10"], row["ndcg@10_ci_low"], row["ndcg@10_ci_high"], row["tune_split"],
             row["tune_ndcg@10"], row["budget_recall"], row["recall_p95_ms"], row["tokens_returned"], row["tokens_naive"])
    if multirun:
        log.info(record_progress(Path(hc.sweep.dir), str(hc.job.num), time.perf_counter() - started))
    return float(row["ndcg@10"])  # the value an optimizing sweeper (Optuna, Nevergrad) would maximise


COMMANDS = ("report", "recommend", "compare", "ingest", "calibrate-floor")


def _default_store() -> Path:
    """The store a default run appends to (conf/config.yaml: results_store)."""
    env = os.environ
    return Path(env.get("TINYCONTEXT_EVAL_STORE") or Path(env.get("TINYCONTEXT_EVAL_CACHE", ".eval_cache")) / "results.sqlite")


def _commands(argv: list[str]) -> int:
    from .compare import compare
    from .report import build_report, load_results, recommend

    parser = argparse.ArgumentParser(prog="tinycontext-eval", description="Rebuild reports or pick a config from a sweep.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="(re)build results.csv, per_query.csv, report.md and plots/ in a sweep dir")
    rep.add_argument("sweep_dir", type=Path)
    rec = sub.add_parser("recommend", help="write the best config under limits as context_config.json")
    rec.add_argument("sweep_dir", type=Path)
    rec.add_argument("--max-p95-ms", type=float, help="recall p95 latency limit")
    rec.add_argument("--max-model-mb", type=float, help="model file size limit")
    rec.add_argument("--metric", help="column to maximise (default: ndcg@10; budget_recall for budget sweeps)")
    rec.add_argument("--dataset", help="which dataset, when the sweep has several")
    rec.add_argument("--out", type=Path, help="output file (default: <sweep dir>/context_config.json)")
    cmp = sub.add_parser("compare", help="paired per-query differences RUN_B - RUN_A with 95%% CIs")
    cmp.add_argument("run_a", help="a run directory (with per_query.csv) or a run id in the results store")
    cmp.add_argument("run_b")
    cmp.add_argument("--store", type=Path, default=None, help="results store for run ids (default: the harness default)")
    cal = sub.add_parser("calibrate-floor", help="a relevance floor (min dense cosine) for a run's model, from its tuning split")
    cal.add_argument("run_dir", type=Path)
    cal.add_argument("--keep", type=float, default=0.95, help="share of queries whose best relevant document stays above it")
    ing = sub.add_parser("ingest", help="append a sweep's result.json files to the local results store")
    ing.add_argument("sweep_dir", type=Path)
    ing.add_argument("--store", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "report":
            print(build_report(args.sweep_dir))
        elif args.command == "calibrate-floor":
            from .report import calibrate_floor

            print(json.dumps(calibrate_floor(args.run_dir, args.keep), indent=2))
        elif args.command == "compare":
            table = compare(args.run_a, args.run_b, store_path=args.store or _default_store())
            print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        elif args.command == "ingest":
            from .records import job_files
            from .store import ResultsStore

            load_results(args.sweep_dir)  # every job checked (hash, derivation) before any is stored
            files = sorted(args.sweep_dir.glob("result.json")) + sorted(args.sweep_dir.glob("*/result.json"))
            with ResultsStore(args.store or _default_store()) as store:
                added = sum(store.append(json.loads(f.read_text(encoding="utf-8")), job_files(f.parent)) for f in files)
            print(f"{added} new runs appended ({len(files) - added} already stored)")
        else:
            out, summary = recommend(args.sweep_dir, max_p95_ms=args.max_p95_ms, max_model_mb=args.max_model_mb,
                                     metric=args.metric, dataset=args.dataset, out=args.out)
            print(json.dumps(summary, indent=2))
            print(f"wrote {out}; use it with TINYCONTEXT_CONFIG_PATH={out}")
    except TinyContextError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def console_main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        sys.exit(_commands(sys.argv[1:]))
    main()


if __name__ == "__main__":
    console_main()

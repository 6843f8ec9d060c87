"""Latency of scrape_urls for 5 pages: fetch (loopback HTTP, through the guard) + extract + rank + fit.

Serves the 5 saved pages of tests/fixtures/web, two LoCoMo chat-archive pages (the web-evidence
experiment's layout) and real pages of tests/fixtures/web/real (one of ~3.7k tokens alone, then five
with their first question each) on 127.0.0.1 and times one scrape_urls call per set, a query per item:
``cold`` = passages not embedded yet (a page the agent has never seen; the model loaded and run
once), ``warm`` = the same pages
again (the embedder's cache holds their passages), plus the same call without a query (no model).
Median of --runs; the load average is printed next to the figures. With ``--out DIR`` the figures
also go to DIR/latency.json and DIR/latency.md (a notes table).

    .venv/bin/python scripts/bench_web.py --runs 5 --out notes/web_evidence/latency
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from web_evidence import REAL_PAGES, PageServer, locomo_site, real_site  # noqa: E402
from tinycontext import load_config  # noqa: E402
from tinycontext.models.backends import create_embedder  # noqa: E402
from tinycontext.web import ascrape_urls  # noqa: E402
from tinycontext.web.scrape import clear_page_cache  # noqa: E402

QUERIES = {"news": "How much will the tram line cost and who pays?", "docs": "How long does it wait between retries?",
           "forum": "Why does my starter smell like acetone?", "product": "How heavy is the backpack?",
           "table": "Which city had the biggest drop in rainfall?"}


def record_spans():
    """An in-memory span exporter behind a tracer provider of our own: the library's stage spans get recorded."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="also write latency.json and latency.md here")
    parser.add_argument("--only", help="time only the sets whose name contains this (e.g. real)")
    parser.add_argument("--stages", action="store_true",
                        help="also time each stage (the library's telemetry spans, kept in memory): fetch, extract, chunk, rank, embed")
    args = parser.parse_args()
    spans = record_spans() if args.stages else None
    load_before = os.getloadavg()
    fixtures = ROOT / "tests" / "fixtures" / "web"
    pages = {f"/{name}.html": (fixtures / f"{name}.html").read_bytes() for name in QUERIES}
    locomo = locomo_site(ROOT.parent / "shared" / "datasets" / "locomo" / "locomo-dev.json", [1, 2, 3, 4], stride=1)
    pages.update(locomo.pages)
    real = real_site(REAL_PAGES, "all")
    pages.update(real.pages)
    firsts = [q for i, q in enumerate(real.questions) if q.url_path not in {p.url_path for p in real.questions[:i]}]
    # load_config: TINYCONTEXT_* variables apply, as in a server process (e.g. TINYCONTEXT_SCRAPE_UNIT_WEIGHT=0).
    config = load_config(allow_private_hosts=True)
    timings: dict[str, list[float]] = {}
    late: dict[str, list[int]] = {}
    # CPU time of the call (every thread of the process): on a shared machine the wall clock measures the
    # others' load too; an idle machine's wall time is about this divided by the cores the call keeps busy.
    cpu_ms: dict[str, list[float]] = {}
    # Per call and stage: the summed span time of that stage over the call's runs (items run concurrently,
    # so stages of several pages overlap and may add up to more than the call's wall time).
    stage_ms: dict[str, dict[str, list[tuple[int, float]]]] = {}
    with PageServer(pages) as server:
        sets = {"5 fixture pages": [{"url": f"{server.base_url}/{n}.html", "query": q} for n, q in QUERIES.items()],
                "3 fixtures + 2 LoCoMo archives (~20k tokens each)":
                    [{"url": f"{server.base_url}/{n}.html", "query": QUERIES[n]} for n in ("news", "docs", "table")]
                    + [{"url": server.base_url + q.url_path, "query": q.query} for q in (locomo.questions[0], locomo.questions[-1])],
                "1 real page (002, ~3.7k tokens)": [{"url": server.base_url + firsts[0].url_path, "query": firsts[0].query}],
                "5 real pages": [{"url": server.base_url + q.url_path, "query": q.query} for q in firsts[:5]]}
        for name, items in sets.items():
            if args.only and args.only not in name:
                continue
            for _ in range(args.runs):
                embedder = create_embedder(config)  # fresh cache: cold
                clear_page_cache()  # and the pages are read (extracted, chunked) anew
                embedder.embed_documents(["a text no page holds"])  # the model loaded and run once, as in a server
                for label, run_items, emb in (("cold", items, embedder), ("warm", items, embedder),
                                              ("no query", [{"url": i["url"]} for i in items], embedder)):
                    if spans is not None:
                        spans.clear()
                    started, cpu = time.perf_counter(), time.process_time()
                    answer = asyncio.run(ascrape_urls(run_items, args.max_tokens, config=config, embedder=emb))
                    if spans is not None:
                        run_stages: dict[str, list[float]] = {}
                        for span in spans.get_finished_spans():
                            run_stages.setdefault(span.name, []).append((span.end_time - span.start_time) / 1e6)
                        for stage, values in run_stages.items():
                            stage_ms.setdefault(f"{name} | {label}", {}).setdefault(stage, []).append((len(values), sum(values)))
                    timings.setdefault(f"{name} | {label}", []).append((time.perf_counter() - started) * 1000)
                    cpu_ms.setdefault(f"{name} | {label}", []).append((time.process_time() - cpu) * 1000)
                    # A page past web_item_timeout, or ranked partly by keywords (a loaded machine), is counted.
                    late.setdefault(f"{name} | {label}", []).append(
                        sum(r["outcome"] != "ok" or "keywords alone" in r.get("note", "") for r in answer["results"]))
    load = f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after ({os.cpu_count()} CPUs)"
    lines = [f"{load}; runs {args.runs}; max_tokens {args.max_tokens}", "",
             "| pages | case | median ms | min ms | median CPU ms | items late (timeout or cut) |", "|---|---|---|---|---|---|"]
    rows = []
    for key, values in timings.items():
        name, label = key.split(" | ")
        rows.append({"pages": name, "case": label, "median_ms": round(statistics.median(values)), "min_ms": round(min(values)),
                     "runs_ms": [round(v) for v in values], "median_cpu_ms": round(statistics.median(cpu_ms[key])),
                     "late_items": late[key]})
        lines.append(f"| {name} | {label} | {rows[-1]['median_ms']} | {rows[-1]['min_ms']} | {rows[-1]['median_cpu_ms']} "
                     f"| {sum(late[key])} |")
    if stage_ms:
        lines += ["", "Stage time per call (median over runs of the stage's spans summed; concurrent pages overlap):", "",
                  "| pages | case | stage | spans per call | median ms |", "|---|---|---|---|---|"]
        for key, stages in stage_ms.items():
            name, label = key.split(" | ")
            for stage, values in sorted(stages.items()):
                lines.append(f"| {name} | {label} | {stage.removeprefix('tinycontext.')} | "
                             f"{statistics.median(n for n, _ in values):g} | {statistics.median(ms for _, ms in values):.0f} |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "latency.json").write_text(json.dumps({"load_before": load_before, "load_after": os.getloadavg(),
                                                          "cpus": os.cpu_count(), "runs": args.runs,
                                                          "max_tokens": args.max_tokens, "results": rows}, indent=1) + "\n")
        (args.out / "latency.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

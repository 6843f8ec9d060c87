"""Web evidence: does scrape_urls hand an agent the evidence of a page for a fraction of its tokens?

Real text laid out as web pages with realistic site chrome, served by a local HTTP server and read
through the real pipeline (httpx fetch behind the SSRF guard, trafilatura, passages, hybrid rank,
the shared budget renderer):

- ``locomo``: each LoCoMo conversation is one chat-archive page (sessions as sections, a cookie
  banner, navigation, a sidebar, a footer); each question (categories 1-4) scrapes its
  conversation's page; the gold evidence is the question's evidence turns.
- ``scifact``: each SciFact test claim scrapes a journal-issue page of abstracts: its relevant
  abstracts among the corpus abstracts that BM25 ranks closest to the claim (hard distractors),
  each with a related-articles box; the gold evidence is the relevant abstracts' sentences.
- ``real``: real pages of public web-extraction benchmarks (``tests/fixtures/web/real``, see its
  README.md for sources and licences) served as they were saved; each question's answer is one
  passage deep in the page (offsets into the page's text); split by page into dev and test.

Evidence recall of an answer (locomo, scifact) = the share of gold units whose text appears in what
the agent receives. Passage recall (real) = the share of questions whose gold passage comes back
with at least 80% of its words inside one window (one passage of the answer: a cut passage whose
halves come back apart does not count). Compared: our answer at each budget, the whole extracted page, its first 5,000
characters (what the reference fetch MCP server returns by default), and a plain BM25 paragraph
picker (the page's paragraphs by FTS5 BM25, whole, until the budget is full). Tokens are those of the text
the agent reads. ``python scripts/web_evidence.py [overrides]`` (Hydra config ``conf/web_evidence.yaml``)
writes results.csv, results.json, per_query.csv, report.md and plots/web_evidence.png to the Hydra output directory.
It lives in scripts/ because it drives tinycontext.web's internals (fetch, rank, fit) separately,
which the harness in evals/ (public API only) does not.
"""

from __future__ import annotations

import asyncio
import html as htmllib
import json
import logging
import os
import random
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from tinycontext import TinyContextConfig
from tinycontext.budget.tokens import TokenCounter
from tinycontext.sqlite import sqlite_driver
from tinycontext.retrieval.fusion import fts_query
from tinycontext.web.chunk import SENTENCE_END
from tinycontext.web.extract import extract_page
from tinycontext.web.fetch import HttpFetcher
from tinycontext.web.present import scrape_page
from tinycontext.web.rank import bm25_ranking
from tinycontext.web.pages import ScrapeItem
from tinycontext.web.scrape import afetch_and_rank, embedder_for

from evals import run as _harness  # noqa: F401  (registers the ${tc_default:...} config resolver)
from evals.datasets import locomo_turn_text
from evals.report import _markdown as markdown_table

log = logging.getLogger("web_evidence")
_NORM = re.compile(r"[\W_]+", re.UNICODE)
FETCH_BASELINE_CHARS = 5000
PASSAGE_WORDS = 0.8  # a gold passage counts when this share of its words comes back inside one window
_WORD = re.compile(r"\w+", re.UNICODE)
REAL_PAGES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "web" / "real"
# dev: tune on (LoCoMo: its dev conversations; SciFact: train claims); test: report (the other
# conversations; test claims); all: every conversation and the test claims.
SPLITS = ("dev", "test", "all")


def norm(text: str) -> str:
    return " " + _NORM.sub(" ", text.lower()).strip() + " "


@dataclass
class Question:
    qid: str
    query: str
    url_path: str
    evidence: list[str]  # gold units: text that must reach the agent (real: the one gold passage)


@dataclass
class Site:
    name: str
    pages: dict[str, bytes]  # path -> HTML
    questions: list[Question]
    scoring: str = "units"  # units: evidence recall; passage: the gold passage whole in one window


# -- site chrome ------------------------------------------------------------------------------------


def chrome(title: str, main: str, sidebar: str, site: str) -> bytes:
    e = htmllib.escape
    nav = "".join(f'<li><a href="/{p.lower()}">{p}</a></li>' for p in ("Home", "Forums", "Members", "Search", "Help", "Log in"))
    page = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(title)} | {site}</title>
<link rel="stylesheet" href="/static/site.css"><script>window.analytics=window.analytics||[];analytics.push(['page']);</script></head>
<body><div class="cookie-banner" role="dialog"><p>We use cookies and similar technologies to run this site, to measure traffic and to
personalise ads. You can accept all cookies or choose which ones we may use.</p><button>Accept all</button><button>Settings</button></div>
<header class="site-header"><a class="logo" href="/">{site}</a><nav><ul>{nav}</ul></nav>
<form action="/search"><input name="q" placeholder="Search {site}"></form></header>
<div class="layout"><main>{main}</main><aside class="sidebar">{sidebar}
<div class="newsletter"><h3>Stay in the loop</h3><p>Get the best threads of the week in your inbox every Friday.</p>
<input type="email"><button>Subscribe</button></div></aside></div>
<footer class="site-footer"><ul><li><a href="/about">About</a></li><li><a href="/privacy">Privacy</a></li><li><a href="/terms">Terms of use</a></li>
<li><a href="/contact">Contact</a></li></ul><p>© 2024 {site}. All rights reserved. Hosted in the EU.</p></footer></body></html>"""
    return page.encode("utf-8")


# -- LoCoMo: one chat-archive page per conversation -------------------------------------------------


def locomo_site(path: Path, categories: list[int], stride: int = 1, conversations: list[str] | None = None,
                long_pages: list[list[str]] | None = None) -> Site:
    """Every conversation is a page; questions only of ``conversations`` (all when None). With ``long_pages``
    (lists of conversations), each list is also laid out as one page, its conversations one after another,
    and the questions (of ``conversations``) scrape those pages instead: pages longer than any one
    conversation, to decide ``scrape_max_chars`` on dev."""
    e = htmllib.escape
    samples = json.loads(path.read_text(encoding="utf-8"))
    pages: dict[str, bytes] = {}
    questions: list[Question] = []
    others = [s["sample_id"] for s in samples]
    articles: dict[str, str] = {}
    evidence_of: dict[str, list[tuple[int, str, list[str]]]] = {}
    for sample in samples:
        conv, c = sample["sample_id"], sample["conversation"]
        numbers = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k))
        texts: dict[str, str] = {}
        sections = []
        for n in numbers:
            turns = []
            for turn in c[f"session_{n}"]:
                texts[turn["dia_id"]] = locomo_turn_text(turn)
                speaker, _, said = texts[turn["dia_id"]].partition(": ")
                turns.append(f'<div class="msg" id="{e(turn["dia_id"])}"><p><strong>{e(speaker)}</strong>: {e(said)}</p>'
                             f'<span class="msg-actions"><a href="#reply">Reply</a> · <a href="#quote">Quote</a></span></div>')
            sections.append(f'<section class="session"><h2>Session {n}: {e(c.get(f"session_{n}_date_time", ""))}</h2>{"".join(turns)}</section>')
        title = f"Chat archive: {c['speaker_a']} and {c['speaker_b']}"
        articles[conv] = f'<h1>{e(title)}</h1><p class="meta">{len(texts)} messages in {len(numbers)} sessions</p>{"".join(sections)}'
        sidebar = ('<h3>Other archives</h3><ul>' + "".join(f'<li><a href="/locomo/{o}.html">Archive {o}</a></li>' for o in others if o != conv)
                   + '</ul><h3>Trending</h3><ul><li><a href="/t/1">Best hiking trails near the city</a></li>'
                   '<li><a href="/t/2">What are you reading this summer?</a></li><li><a href="/t/3">Pottery class recommendations</a></li></ul>')
        pages[f"/locomo/{conv}.html"] = chrome(title, f"<article>{articles[conv]}</article>", sidebar, "ChatArchive")
        for i, qa in enumerate(sample["qa"]):
            evidence = [texts[d] for d in qa.get("evidence", []) if d in texts]
            if qa.get("category") in categories and evidence and (conversations is None or conv in conversations):
                evidence_of.setdefault(conv, []).append((i, qa["question"], evidence))
    if long_pages:
        for group in long_pages:
            name = "+".join(group)
            # One article: an extractor keeps a page's main article, not each of several.
            pages[f"/locomo/{name}.html"] = chrome(f"Chat archives {', '.join(group)}",
                                                   f"<article>{''.join(articles[g] for g in group)}</article>", "<h3>Archives</h3>",
                                                   "ChatArchive")
            questions.extend(Question(f"{name}:{conv}:{i}", query, f"/locomo/{name}.html", evidence)
                             for conv in group for i, query, evidence in evidence_of.get(conv, []))
    else:
        questions = [Question(f"{conv}:{i}", query, f"/locomo/{conv}.html", evidence)
                     for conv, asked in evidence_of.items() for i, query, evidence in asked]
    return Site("locomo", pages, questions[::stride])


# -- SciFact: one journal-issue page of abstracts per claim ------------------------------------------


def scifact_site(path: Path, abstracts_per_page: int, limit: int | None, seed: int, qrels_split: str = "test") -> Site:
    """One page per claim of ``qrels_split`` (``train`` claims tune, ``test`` claims report)."""
    e = htmllib.escape
    corpus = {d["_id"]: d for d in map(json.loads, (path / "corpus.jsonl").read_text(encoding="utf-8").splitlines())}
    claims = {q["_id"]: q["text"] for q in map(json.loads, (path / "queries.jsonl").read_text(encoding="utf-8").splitlines())}
    qrels: dict[str, list[str]] = {}
    for line in (path / "qrels" / f"{qrels_split}.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, score = line.split("\t")
        if int(score) > 0 and did in corpus:
            qrels.setdefault(qid, []).append(did)
    driver, _ = sqlite_driver()
    db = driver.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE docs USING fts5(title, text, tokenize='porter unicode61 remove_diacritics 2')")
    ids = list(corpus)
    db.executemany("INSERT INTO docs(rowid, title, text) VALUES (?, ?, ?)",
                   [(i + 1, corpus[d]["title"], corpus[d]["text"]) for i, d in enumerate(ids)])
    rng = random.Random(seed)
    pages: dict[str, bytes] = {}
    questions: list[Question] = []
    for qid in sorted(qrels, key=int)[:limit] if limit else sorted(qrels, key=int):
        relevant = qrels[qid]
        match = fts_query(claims[qid])
        near = [ids[r[0] - 1] for r in db.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?",
                                                   (match, abstracts_per_page * 2)).fetchall()] if match else []
        distractors = [d for d in near if d not in relevant][: abstracts_per_page - len(relevant)]
        chosen = relevant + distractors
        rng.shuffle(chosen)
        articles = []
        for position, did in enumerate(chosen):
            doc = corpus[did]
            related = [corpus[chosen[(position + k) % len(chosen)]]["title"] for k in (1, 2, 3)]
            articles.append(f'<article class="abstract" id="a{did}"><h2>{e(doc["title"])}</h2><p class="authors">Research article · Open access</p>'
                            f'<p>{e(doc["text"])}</p><aside class="related"><h4>Related articles</h4><ul>'
                            + "".join(f'<li><a href="/a/{k}">{e(t)}</a></li>' for k, t in enumerate(related)) + "</ul></aside></article>")
        title = f"Issue {qid}: research abstracts"
        sidebar = ('<h3>Most read this month</h3><ul><li><a href="/m/1">A guide to statistical power</a></li>'
                   '<li><a href="/m/2">Reproducibility in the life sciences</a></li></ul><h3>Journals</h3><ul>'
                   '<li><a href="/j/cell">Cell biology</a></li><li><a href="/j/med">Clinical medicine</a></li></ul>')
        pages[f"/scifact/{qid}.html"] = chrome(title, f"<h1>{e(title)}</h1>{''.join(articles)}", sidebar, "OpenJournals")
        evidence = [s for did in relevant for s in SENTENCE_END.split(corpus[did]["text"].strip()) if len(s) > 20]
        questions.append(Question(qid, claims[qid], f"/scifact/{qid}.html", evidence))
    db.close()
    return Site("scifact", pages, questions)


# -- real pages: saved pages of public extraction benchmarks, hand-written questions -----------------


def real_site(root: Path, split: str) -> Site:
    """The saved pages of ``root`` (pages/<name>.html.gz) and the questions of ``split`` (dev, test, all)."""
    import gzip

    questions = [json.loads(line) for line in (root / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    chosen = [q for q in questions if split == "all" or q["split"] == split]
    pages = {f"/real/{name}.html": gzip.decompress((root / "pages" / f"{name}.html.gz").read_bytes())
             for name in sorted({q["page"] for q in chosen})}
    return Site("real", pages, [Question(q["qid"], q["query"], f"/real/{q['page']}.html", [q["passage"]])
                                for q in chosen], scoring="passage")


# -- scoring -----------------------------------------------------------------------------------------


def words(text: str) -> Counter:
    return Counter(_WORD.findall(text.lower()))


def passage_share(passage: str, windows: list[str]) -> float:
    """The largest share of ``passage``'s words (with repeats) that one window holds."""
    gold = words(passage)
    total = sum(gold.values())
    if not total:
        return 0.0
    return max((sum((gold & words(w)).values()) / total for w in windows), default=0.0)


def bm25_paragraphs(query: str, markdown: str, budget: int, counter: TokenCounter) -> list[str]:
    """The reference picker: the page's paragraphs (blank-line separated) best BM25 first, each whole, while
    they fit ``budget`` tokens joined by blank lines; shown in page order."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", markdown) if p.strip()]
    costs = counter.count_many(paragraphs) if paragraphs else []
    chosen, used = [], 0
    for i, _ in bm25_ranking(query, paragraphs):
        cost = costs[i] + (2 if chosen else 0)
        if used + cost <= budget:
            chosen.append(i)
            used += cost
    return [paragraphs[i] for i in sorted(chosen)]


def evidence_recall(evidence: list[str], received: str) -> float:
    haystack = norm(received)
    return sum(norm(unit) in haystack for unit in evidence) / len(evidence)


async def evaluate(site: Site, base_url: str, budgets: list[int], config: TinyContextConfig, order: str,
                   embedder=None) -> list[dict]:
    counter = TokenCounter(config.encoding_name)
    embedder = embedder or embedder_for(config)
    fetcher = HttpFetcher(config)
    rows: list[dict] = []
    whole_pages: dict[str, str] = {}
    try:
        for q in tqdm(site.questions, desc=f"web evidence {site.name}", unit="q"):
            item = ScrapeItem(base_url + q.url_path, q.query)
            ranked, took = {}, []  # ranked per budget, as scrape_urls does (a larger budget embeds more passages)
            for budget in budgets:
                started = time.perf_counter()
                (ranked[budget],) = await afetch_and_rank([item], config=config, fetcher=fetcher, embedder=embedder,
                                                          max_tokens=budget)
                took.append((time.perf_counter() - started) * 1000)
            rank_ms = took[0]  # the smallest budget's call
            page = ranked[budgets[0]]
            if page.outcome != "ok":
                raise RuntimeError(f"{item.url}: {page.outcome} {page.fetch.detail}")
            if q.url_path not in whole_pages:  # the baselines' page (scrape extracts it again per question)
                whole_pages[q.url_path] = extract_page(page.fetch).markdown
            markdown = whole_pages[q.url_path]
            base = {"dataset": site.name, "qid": q.qid, "evidence_units": len(q.evidence), "fetch_rank_ms": rank_ms}

            def score(text: str, windows: list[str]) -> dict:
                if site.scoring == "passage":
                    share = passage_share(q.evidence[0], windows)
                    return {"recall": float(share >= PASSAGE_WORDS), "words": share}
                return {"recall": evidence_recall(q.evidence, text)}

            for method, text in (("whole page", markdown), ("first 5,000 chars", markdown[:FETCH_BASELINE_CHARS])):
                rows.append({**base, "method": method, "budget": None, "tokens": counter.count(text), **score(text, [text])})
            for budget in budgets:
                fitted = scrape_page([ranked[budget]], max_tokens=budget, counter=counter,
                                     links_max_tokens=config.scrape_links_max_tokens, order=order)
                windows = [p["text"] for r in fitted.structured["results"] for p in r.get("passages", [])]
                rows.append({**base, "method": "scrape_urls", "budget": budget, "tokens": fitted.text_tokens,
                             "structured_tokens": fitted.structured_tokens, **score(fitted.text, windows)})
                picked = bm25_paragraphs(q.query, markdown, budget, counter)
                text = "\n\n".join(picked)
                rows.append({**base, "method": "BM25 paragraphs", "budget": budget, "tokens": counter.count(text),
                             **score(text, picked)})
    finally:
        await fetcher.aclose()
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    import pandas as pd

    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].fillna(0).astype(int)
    out = []
    for (dataset, method, budget), group in df.groupby(["dataset", "method", "budget"], sort=False):
        whole = df[(df.dataset == dataset) & (df.method == "whole page")]
        out.append({"dataset": dataset, "method": method, "budget": int(budget) or "", "questions": len(group),
                    "evidence_recall": round(group.recall.mean(), 4),
                    **({"passage_words": round(group.words.mean(), 4)} if "words" in group and group.words.notna().all() else {}),
                    "mean_tokens": round(group.tokens.mean(), 1),
                    "recall_vs_whole": round(group.recall.mean() / whole.recall.mean(), 4),
                    "tokens_vs_whole": round(group.tokens.mean() / whole.tokens.mean(), 4)})
    return out


def write_report(summary: list[dict], rows: list[dict], out: Path, cfg: DictConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "per_query.csv", index=False)
    table = pd.DataFrame(summary)
    table.to_csv(out / "results.csv", index=False)
    (out / "plots").mkdir(exist_ok=True)
    datasets = list(dict.fromkeys(table.dataset))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.5), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        part = table[table.dataset == name]
        ours = part[part.method == "scrape_urls"]
        ax.plot(ours.mean_tokens, ours.evidence_recall, "o-", label="scrape_urls (budgets " + ", ".join(map(str, ours.budget)) + ")")
        picker = part[part.method == "BM25 paragraphs"]
        ax.plot(picker.mean_tokens, picker.evidence_recall, "x--", label="BM25 paragraph picker")
        for method, marker in (("whole page", "s"), ("first 5,000 chars", "^")):
            row = part[part.method == method]
            ax.plot(row.mean_tokens, row.evidence_recall, marker, markersize=9, label=method)
        ax.set_xscale("log")
        ax.set_xlabel("tokens the agent reads (mean per question, log)")
        ax.set_ylabel("gold passages whole in one window" if name == "real" else "gold-evidence recall")
        ax.set_title(f"web evidence: {name}")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "plots" / "web_evidence.png", dpi=120)
    plt.close(fig)
    latency = pd.DataFrame(rows).drop_duplicates(["dataset", "qid"]).groupby("dataset").fetch_rank_ms.median()
    (out / "results.json").write_text(json.dumps({"config": OmegaConf.to_container(cfg), "load_average": os.getloadavg(),
                                                  "summary": summary, "median_fetch_rank_ms": latency.round(1).to_dict()},
                                                 indent=1, default=str) + "\n", encoding="utf-8")
    lines = ["# Web evidence", "", f"Config: `{OmegaConf.to_yaml(cfg).strip().replace(chr(10), '; ')}`", "",
             markdown_table(table), "",
             "Median fetch + extract + rank per question (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in latency.items())
             + "; load average at the end: " + " / ".join(f"{v:.2f}" for v in os.getloadavg()), "",
             "![web evidence](plots/web_evidence.png)"]
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


@hydra.main(version_base="1.3", config_path="../conf", config_name="web_evidence")
def main(cfg: DictConfig) -> None:
    out = Path(HydraConfig.get().runtime.output_dir)
    shared = Path(cfg.shared_dir)
    sites = []
    split = cfg.split
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if "locomo" in cfg.datasets:
        conversations = None if split == "all" else list(cfg.locomo[f"{split}_conversations"])
        long_pages = [list(group) for group in cfg.locomo.long_pages] if cfg.locomo.long_pages else None
        sites.append(locomo_site(shared / "datasets/locomo/locomo-dev.json", list(cfg.locomo.categories), cfg.locomo.stride,
                                 conversations, long_pages))
    if "real" in cfg.datasets:
        sites.append(real_site(REAL_PAGES, split))
    if "scifact" in cfg.datasets:
        sites.append(scifact_site(shared / "datasets/scifact", cfg.scifact.abstracts_per_page, cfg.scifact.limit, cfg.seed,
                                  "train" if split == "dev" else "test"))
    config = TinyContextConfig(allow_private_hosts=True, embedding_cache_size=cfg.embedding_cache_size,
                               scrape_chunk_tokens=cfg.chunk_tokens, scrape_passage_tokens=cfg.passage_tokens,
                               scrape_neighbour_weight=cfg.neighbour_weight, scrape_unit_weight=cfg.unit_weight,
                               scrape_unit_candidates=cfg.unit_candidates,
                               **({"embedding_model": cfg.embedding_model} if cfg.embedding_model else {}),
                               **OmegaConf.to_container(cfg.engine, resolve=True))
    pages = {path: body for site in sites for path, body in site.pages.items()}
    rows: list[dict] = []
    with PageServer(pages) as server:
        for site in sites:
            rows.extend(asyncio.run(evaluate(site, server.base_url, list(cfg.budgets), config, cfg.order)))
    summary = summarise(rows)
    write_report(summary, rows, out, cfg)
    for row in summary:
        log.info("%s", row)
    log.info("report: %s", out / "report.md")


class PageServer:
    """Serves the generated pages on 127.0.0.1 (a real HTTP server: the fetch path is the real one)."""

    def __init__(self, pages: dict[str, bytes]):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                body = pages.get(self.path.split("?")[0])
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "PageServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    main()

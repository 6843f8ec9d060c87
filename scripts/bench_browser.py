"""Browser tools: view size (tokens) of large pages with and without find/depth, and the time of
navigate + act, against HTML files served on 127.0.0.1 by this script.

    .venv/bin/python scripts/bench_browser.py [--runs 5] [--find REGEX] [page.html ...]

Without pages it uses the Node.js API docs that Debian's nodejs package installs (large real
pages with a navigation sidebar), when present. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tqdm import tqdm

from tinycontext import TinyContextConfig
from tinycontext.budget.tokens import TokenCounter
from tinycontext.web.browser import BrowserService

SMALL_PAGE = """<!doctype html><html lang=en><head><title>Product</title></head><body><h1>Widget 3000</h1>
<button onclick="document.getElementById('d').hidden = false">Show details</button>
<div id=d hidden><p>Battery life: 42 hours</p></div></body></html>"""
NODE_DOCS = [Path("/usr/share/doc/nodejs/api/process.html"), Path("/usr/share/doc/nodejs/api/url.html")]


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(root: Path) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def timed(fn) -> tuple[float, dict]:
    started = time.perf_counter()
    out = fn()
    return (time.perf_counter() - started) * 1000, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--find", default=r"\bexit\b", help="regex for the find view")
    parser.add_argument("--depth", type=int, default=2)
    args = parser.parse_args()
    pages = args.pages or [p for p in NODE_DOCS if p.is_file()]
    if not pages:
        sys.exit("No pages given and no Node.js docs installed (apt-get install nodejs); pass HTML files.")
    root = Path(os.path.commonpath([p.resolve().parent for p in pages])).parent  # siblings' assets resolve
    server, port = serve(root)
    counter = TokenCounter()
    with tempfile.TemporaryDirectory() as tmp:
        service = BrowserService(TinyContextConfig(allow_private_hosts=True, memory_db_path=Path(tmp) / "m.db"))
        report: dict = {"load_average": os.getloadavg(), "runs": args.runs, "find": args.find, "depth": args.depth, "pages": []}
        try:
            small_dir = Path(tmp) / "small"
            small_dir.mkdir()
            (small_dir / "index.html").write_text(SMALL_PAGE, encoding="utf-8")
            small_server, small_port = serve(small_dir)
            small_url = f"http://127.0.0.1:{small_port}/index.html"
            first_ms, _ = timed(lambda: service.call("navigate", "bench", url=small_url))
            report["first_navigate_ms_with_browser_start"] = round(first_ms)
            nav, click = [], []
            for _ in tqdm(range(args.runs), desc="small page", file=sys.stderr):
                ms, view = timed(lambda: service.call("navigate", "bench", url=small_url))
                nav.append(ms)
                ref = view["refs"][0]
                ms, after = timed(lambda: service.call("act", "bench", action="click", ref=ref))
                assert "Battery life" in after["view"]
                click.append(ms)
            report["small_page"] = {"navigate_ms_median": round(statistics.median(nav)),
                                    "click_ms_median": round(statistics.median(click)), "view_tokens": view["tokens"]}
            small_server.shutdown()
            for page in pages:
                url = f"http://127.0.0.1:{port}/{page.resolve().relative_to(root)}"
                nav, look, click = [], [], []
                for _ in tqdm(range(args.runs), desc=page.name, file=sys.stderr):
                    ms, view = timed(lambda: service.call("navigate", "bench", url=url, max_tokens=1_000_000))
                    nav.append(ms)
                    ms, _ = timed(lambda: service.call("act", "bench", action="look", depth=args.depth))
                    look.append(ms)
                    links = [line for line in view["view"].splitlines() if "- link " in line and "ref=" in line]
                    link = links[min(30, len(links) - 1)]  # past the visually hidden "skip to content" links
                    ref = link.rsplit("ref=", 1)[1].split()[0].rstrip(":")
                    ms, _ = timed(lambda: service.call("act", "bench", action="click", ref=ref, depth=args.depth))
                    click.append(ms)
                full = service.call("navigate", "bench", url=url, max_tokens=1_000_000)
                default = service.call("act", "bench", action="look")
                shallow = service.call("act", "bench", action="look", depth=args.depth, max_tokens=1_000_000)
                found = service.call("act", "bench", action="look", find=args.find, max_tokens=1_000_000)
                html = page.read_text(encoding="utf-8", errors="replace")
                report["pages"].append({
                    "page": str(page), "html_tokens": counter.count(html),
                    "view_tokens_full": full["tokens"], "view_lines_full": full["view"].count("\n"),
                    "view_tokens_default_budget": default["tokens"], "default_budget_truncated": default["truncated"],
                    f"view_tokens_depth_{args.depth}": shallow["tokens"],
                    "view_tokens_find": found["tokens"], "find_matches": found.get("matches"),
                    "navigate_ms_median": round(statistics.median(nav)), "look_ms_median": round(statistics.median(look)),
                    "click_ms_median": round(statistics.median(click)),
                })
        finally:
            service.close()
            server.shutdown()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

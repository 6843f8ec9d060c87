"""Compare main-content extractors on the saved pages in tests/fixtures/web (expected text vs boilerplate).

    .venv/bin/python scripts/web_extraction_compare.py

Prints per extractor: expected snippets found, boilerplate snippets leaked, median time per page.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import justext
import lxml.html
import trafilatura

from tinycontext.web.extract import extract_html

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "web"


def trafilatura_with(**options):
    return lambda html: trafilatura.extract(html, output_format="markdown", include_tables=True, include_formatting=True,
                                            include_comments=True, **options) or ""


def jus(html: str) -> str:
    return "\n\n".join(p.text for p in justext.justext(html.encode(), justext.get_stoplist("English")) if not p.is_boilerplate)


def whole_text(html: str) -> str:
    tree = lxml.html.document_fromstring(html)
    for bad in tree.xpath("//script|//style"):
        bad.drop_tree()
    return tree.text_content()


EXTRACTORS = {
    "tinycontext (trafilatura, as configured)": lambda html: extract_html(html, "https://site.example/").markdown,
    "trafilatura default": trafilatura_with(),
    "trafilatura favor_recall": trafilatura_with(favor_recall=True),
    "trafilatura favor_precision": trafilatura_with(favor_precision=True),
    "justext": jus,
    "all text (no extraction)": whole_text,
}


def main() -> None:
    pages = [(p.stem, p.read_text(encoding="utf-8"), json.loads(p.with_suffix(".json").read_text(encoding="utf-8")))
             for p in sorted(FIXTURES.glob("*.html"))]
    print(f"{len(pages)} pages: {', '.join(name for name, _, _ in pages)}")
    print("| extractor | expected found | boilerplate leaked | median ms/page |")
    print("|---|---|---|---|")
    for name, extract in EXTRACTORS.items():
        found = expected = leaked = boiler = 0
        times = []
        for _, html, spec in pages:
            started = time.perf_counter()
            text = extract(html)
            times.append((time.perf_counter() - started) * 1000)
            expected += len(spec["expected"])
            found += sum(s in text for s in spec["expected"])
            boiler += len(spec["boilerplate"])
            leaked += sum(s in text for s in spec["boilerplate"])
        print(f"| {name} | {found}/{expected} | {leaked}/{boiler} | {statistics.median(times):.1f} |")


if __name__ == "__main__":
    main()

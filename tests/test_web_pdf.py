"""PDFs in scrape_urls: a real PDF (built here, Helvetica text) served on loopback goes through the
same passages, ranking and budget as HTML; its size limit, page limit and damage are outcomes."""

from __future__ import annotations

import pytest

from conftest import HashEmbedder
from netguard import LocalServer, loopback_only, send  # noqa: F401  (fixture)
from tinycontext import TinyContextConfig
from tinycontext.web.extract import extract_page
from tinycontext.web.fetch import FetchResult
from tinycontext.web.scrape import scrape_urls

TITLE = "Alpine Glacier Survey 2024"
# (font size, x, text) per line, top to bottom; every page also gets a running header and a page number.
PAGES = [
    [(22, 72, "Alpine Glacier Survey"), (11, 72, "The survey measured forty glaciers in the Alps between"),
     (11, 72, "April and October. Volunteers walked each glacier front"), (11, 72, "twice and logged its position."),
     (16, 72, "Methods"), (11, 72, "Positions were taken with a GNSS receiver accurate to ten"),
     (11, 72, "centimetres; ice thickness came from ground-penetrating"), (11, 72, "radar at fixed stakes.")],
    [(16, 72, "Results"), (11, 72, "The Rhone Glacier retreated 52 metres, the largest loss"),
     (11, 72, "recorded this year. Smaller glaciers below 2,800 metres lost"), (11, 72, "a third of their remaining vol-"),
     (11, 72, "ume since 2010."), (11, 72, "• Aletsch: 41 metres"), (11, 90, "of retreat at the tongue"),
     (11, 72, "Snow cover in spring was thin.")],
    [(16, 72, "Outlook"), (11, 72, "At this rate most glaciers below 3,000 metres will be gone"), (11, 72, "before 2050.")],
]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[list[tuple[int, int, str]]], title: str = "") -> bytes:
    """A small, valid PDF: one Helvetica text line per entry, a header and page number on each page."""
    objects: list[bytes] = []
    kids = []
    font_id = 3 + 2 * len(pages)
    for number, lines in enumerate(pages, 1):
        ops, y = [f"BT /F1 9 Tf 72 800 Td ({_escape('Glacier Survey Report - internal')}) Tj ET"], 760
        for size, x, text in lines:
            y -= int(size * 1.9) if size > 11 else 14
            ops.append(f"BT /F1 {size} Tf {x} {y} Td ({_escape(text)}) Tj ET")
            if size > 11:
                y -= 8
        ops.append(f"BT /F1 9 Tf 290 40 Td (Page {number}) Tj ET")
        stream = "\n".join(ops).encode("cp1252")
        page_id, content_id = 3 + 2 * (number - 1), 4 + 2 * (number - 1)
        kids.append(f"{page_id} 0 R")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents {content_id} 0 R "
                       f"/Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>".encode(), *objects,
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
               f"<< /Title ({_escape(title)}) >>".encode()]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, len(objects), xref)
    return bytes(out)


@pytest.fixture
def web_config(tmp_path) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, web_fetch_timeout=2.0,
                             web_max_bytes=200_000)


def pdf(body: bytes, content_type: str = "application/pdf"):
    return lambda h: send(h, 200, body, content_type)


def test_pdf_text_becomes_markdown_with_headings_paragraphs_and_lists():
    page = extract_page(FetchResult("http://x/a.pdf", content_type="application/pdf", body=make_pdf(PAGES, TITLE)))
    md = page.markdown
    assert page.title == TITLE
    assert md.startswith("# Alpine Glacier Survey\n\nThe survey measured forty glaciers in the Alps between April and October.")
    assert "## Methods\n\nPositions were taken" in md and "## Results" in md and "## Outlook" in md
    assert "a third of their remaining volume since 2010." in md  # the hyphenated word is joined
    assert "\n\n- Aletsch: 41 metres of retreat at the tongue\n\nSnow cover in spring was thin." in md
    assert "Glacier Survey Report - internal" not in md and "Page 2" not in md  # running header, page numbers


def test_pdf_title_falls_back_to_the_first_heading_and_pages_are_capped():
    body = make_pdf(PAGES)
    page = extract_page(FetchResult("http://x/a.pdf", content_type="application/pdf", body=body), pdf_max_pages=1)
    assert page.title == "Alpine Glacier Survey"
    assert "Methods" in page.markdown and "Results" not in page.markdown


def test_pdf_goes_through_the_same_ranked_passages_and_budget(loopback_only, web_config):
    body = make_pdf(PAGES, TITLE)
    routes = {"/survey.pdf": pdf(body), "/sniffed": pdf(body, ""), "/binary": pdf(body, "application/octet-stream"),
              "/broken.pdf": pdf(b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage"),
              "/big.pdf": pdf(body + b"\n%" + b"x" * 300_000)}
    with LocalServer(routes) as server:
        # BM25 alone (no model): the ranking is the PDF's words, not a hash embedder's noise.
        answer = scrape_urls([{"url": server.url("/survey.pdf"), "query": "How far did the Rhone Glacier retreat?"}], 170,
                             order="rank", config=web_config.model_copy(update={"embedding_backend": "none"}))
        others = scrape_urls([server.url(p) for p in ("/sniffed", "/binary", "/broken.pdf", "/big.pdf")], 2000,
                             config=web_config, embedder=HashEmbedder())
    (result,) = answer["results"]
    assert result["outcome"] == "ok" and result["title"] == TITLE
    assert "The Rhone Glacier retreated 52 metres" in result["passages"][0]["text"]
    assert answer["truncated"]
    # A PDF is read by its bytes: untyped, or served as application/octet-stream.
    assert [r["outcome"] for r in others["results"]] == ["ok", "ok", "empty", "too_large"]

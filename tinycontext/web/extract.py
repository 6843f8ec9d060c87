"""A fetched body to clean Markdown: main content (trafilatura), title, and the page's links.

Nothing from a page is executed: HTML is parsed as data (lxml), scripts and styles are dropped.
"""

from __future__ import annotations

import codecs
import re
from urllib.parse import urldefrag, urljoin, urlsplit

import charset_normalizer
import lxml.html
import trafilatura
from lxml import etree

from .deadline import Deadline
from .fetch import HTML_TYPES, PDF_TYPES, FetchResult
from .pages import ExtractedPage, Link
from .pdf import extract_pdf

MAX_LINKS = 300
_DETECT_BYTES = 64 * 1024
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_SPACE = re.compile(r"\s+")
# What is left of an action bar ("Reply · Quote", "Share | Report") once its link texts are removed.
_SEPARATORS = re.compile(r"^[\s·•|/,;:()\[\]-]*$")
_ACTION_BAR_CHARS = 60


def _codec(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().lower()).name
    except LookupError:
        return None


def decode_body(body: bytes, declared: str | None = None, *, html: bool = True) -> str:
    """Text of a body whose declared charset may be missing or wrong.

    A BOM wins; then valid UTF-8 (pages labelled latin-1 that are really UTF-8 are common, and
    non-ASCII bytes that happen to be valid UTF-8 are rare otherwise); then the header's charset,
    then a ``<meta charset>``; with no charset declared at all, charset-normalizer's guess; last
    windows-1252 with replacement characters, which never fails.
    """
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body.decode(name, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    meta = _META_CHARSET.search(body[:4096]) if html else None
    labels = (_codec(declared), _codec(meta.group(1).decode("ascii", "ignore")) if meta else None)
    for name in labels:
        if name and name not in ("utf-8", "utf-16", "utf-32"):
            try:
                return body.decode(name)
            except (UnicodeDecodeError, LookupError):
                continue
    if not any(labels):
        # Nothing declared: detect (Shift-JIS, GBK, KOI8-R... pages without a charset); a prefix is enough.
        guess = charset_normalizer.from_bytes(body[:_DETECT_BYTES]).best()
        if guess is not None:
            return body.decode(guess.encoding, errors="replace")
    return body.decode("cp1252", errors="replace")


def _title_from(tree) -> str:
    for xpath in ("//meta[@property='og:title']/@content", "//title/text()", "//h1//text()"):
        found = [t for t in tree.xpath(xpath) if str(t).strip()]
        if found:
            return _SPACE.sub(" ", str(found[0])).strip()
    return ""


def _links(tree, url: str) -> list[Link]:
    page, base = urldefrag(url)[0], url
    base_href = tree.xpath("//base/@href")
    if base_href:
        base = urljoin(url, str(base_href[0]).strip())
    seen: set[str] = set()
    links: list[Link] = []
    for anchor in tree.iter("a"):
        href = (anchor.get("href") or "").strip()
        if not href or href.startswith("#"):
            continue
        try:
            url = urldefrag(urljoin(base, href))[0]
            scheme = urlsplit(url).scheme
        except ValueError:
            continue
        text = _SPACE.sub(" ", anchor.text_content() or anchor.get("title") or "").strip()
        if scheme not in ("http", "https") or url == page or url in seen or not text:
            continue
        seen.add(url)
        links.append(Link(url, text[:200]))
        if len(links) >= MAX_LINKS:
            break
    return links


def _drop_action_bars(tree) -> None:
    """Remove small blocks made only of links (per-post "Reply · Quote" bars, share buttons).

    trafilatura weighs link density per block: a short forum message next to its action links
    looks like navigation and is dropped whole. The links themselves are already collected.
    """
    for element in list(tree.iter("span", "div", "p", "li", "ul", "nav")):
        if element.getparent() is None or element.find(".//a") is None:
            continue
        text = element.text_content()
        if len(text.strip()) > _ACTION_BAR_CHARS:
            continue
        rest = text
        for anchor in element.iter("a"):
            rest = rest.replace(anchor.text_content(), "", 1)
        if _SEPARATORS.match(rest):
            element.drop_tree()


def _cut_after(tree, limit: int) -> bool:
    """Drop everything after the first ``limit`` characters of text (in document order); whether it did.
    Main-content extraction costs time with the size of the tree, and holds the GIL while it works."""
    total = 0
    for element in tree.iter():
        total += len(element.text or "") + len(element.tail or "")
        if total > limit:
            for child in list(element):
                element.remove(child)
            node = element
            while (parent := node.getparent()) is not None:
                for later in list(node.itersiblings()):
                    parent.remove(later)
                node = parent
            return True
    return False


def extract_html(html: str, url: str, *, max_chars: int | None = None, deadline: Deadline | None = None,
                 links: bool = True) -> ExtractedPage:
    """Main content as Markdown (headings, lists, tables, code kept), the title and the links (none collected
    when ``links`` is false: an answer below LINKS_FROM_TOKENS shows none); with
    ``max_chars``, only the part of the page holding the first twice that many characters of text is read.
    TimeoutError past the ``deadline`` (checked between steps; each is bounded by the caps)."""
    check = deadline.check if deadline is not None else lambda: None
    try:
        tree = lxml.html.document_fromstring(html)
    except (etree.ParserError, ValueError):
        return ExtractedPage(url, "", "")
    check()
    for bad in tree.xpath("//script|//style|//noscript|//template"):
        bad.drop_tree()
    title = _title_from(tree)
    found = _links(tree, url) if links else []
    cut = max_chars is not None and _cut_after(tree, 2 * max_chars)  # twice: boilerplate is dropped later
    check()
    _drop_action_bars(tree)
    check()
    # favor_recall: on the saved pages in tests/fixtures/web it keeps short list items that the
    # default drops, with no more boilerplate (scripts/web_extraction_compare.py).
    markdown = trafilatura.extract(tree, url=url, output_format="markdown", include_tables=True, favor_recall=True,
                                   include_formatting=True, include_comments=True, include_links=False,
                                   include_images=False, with_metadata=False) or ""
    return ExtractedPage(url, title, markdown.strip(), found, cut)


def extract_page(result: FetchResult, *, pdf_max_pages: int = 200, max_chars: int | None = None,
                 deadline: Deadline | None = None, links: bool = True) -> ExtractedPage:
    """The page a successful fetch holds (HTML through trafilatura, PDF through
    :mod:`tinycontext.web.pdf`, at most ``pdf_max_pages`` pages; plain text as it is), its text
    at most ``max_chars`` characters (``cut`` says when it was cut); TimeoutError past the ``deadline``."""
    url = result.final_url or result.url
    if result.content_type in PDF_TYPES:
        page = extract_pdf(result.body, url, max_pages=pdf_max_pages, deadline=deadline)
    elif result.content_type in HTML_TYPES:
        page = extract_html(decode_body(result.body, result.charset), url, max_chars=max_chars, deadline=deadline,
                            links=links)
    else:
        text = decode_body(result.body, result.charset, html=False).replace("\r\n", "\n").replace("\x00", "").strip()
        page = ExtractedPage(url, text.split("\n", 1)[0][:120].strip() if text else "", text)
    if max_chars is not None and len(page.markdown) > max_chars:
        # A prefix: passage offsets stay offsets into the page's text.
        page.markdown, page.cut = page.markdown[:max_chars], True
    return page

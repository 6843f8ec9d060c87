"""scrape_urls against pages served on loopback: passages, budget, outcomes, hostile servers.

Every test runs under ``loopback_only``: any attempt to reach beyond 127.0.0.0/8 and ::1 fails it.
"""

from __future__ import annotations

import gzip
import math
import time

import pytest

from conftest import HashEmbedder
from netguard import LocalServer, loopback_only, redirect, send  # noqa: F401  (fixture)
from tinycontext import TinyContextConfig
from tinycontext.budget.tokens import TokenCounter
from tinycontext.errors import InvalidInputError, RecallBudgetError
from tinycontext.budget.render import to_json
from tinycontext.web import guard as guard_mod
from tinycontext.web.extract import decode_body
from tinycontext.web.guard import classify
from tinycontext.web.scrape import scrape_urls

ARTICLE = """<!doctype html><html><head><meta charset="utf-8"><title>Rivers of Europe | Geo Weekly</title></head><body>
<nav><a href="/">Home</a> | <a href="/world">World</a> | <a href="/science">Science</a> | <a href="/login">Log in</a></nav>
<div id="cookie-banner">We use cookies to improve your experience. <a href="/privacy">Privacy policy</a> <button>Accept all</button></div>
<main><article>
<h1>Rivers of Europe</h1>
<p class="byline">By Ana Ruiz, 3 March 2024</p>
<p>Europe has thousands of rivers. They shaped trade routes, borders and the location of its great cities
for more than two thousand years, and they still carry a large share of inland freight today.</p>
<h2>The Danube</h2>
<p>The Danube is the second-longest river in Europe, flowing 2,850 kilometres from the Black Forest in Germany
to the Black Sea. It passes through ten countries, more than any other river in the world, including Austria,
Hungary, Serbia and Romania, and four capital cities: Vienna, Bratislava, Budapest and Belgrade.</p>
<h2>The Rhine</h2>
<p>The Rhine rises in the Swiss Alps and flows north to the North Sea through the Netherlands. It is one of the
busiest waterways in the world: barges carry coal, grain and containers between Basel and Rotterdam.</p>
<h3>Flooding</h3>
<p>Spring snowmelt in the Alps makes Rhine floods most likely between May and July; the 1995 flood forced the
evacuation of 250,000 people in the Netherlands.</p>
<h2>The Volga</h2>
<p>The Volga is the longest river in Europe at 3,530 kilometres. It flows entirely within Russia into the Caspian Sea
and its basin is home to about forty per cent of the Russian population.</p>
<table><tr><th>River</th><th>Length (km)</th></tr><tr><td>Volga</td><td>3,530</td></tr><tr><td>Danube</td><td>2,850</td></tr>
<tr><td>Rhine</td><td>1,230</td></tr></table>
</article></main>
<aside><h3>Related articles</h3><ul><li><a href="/lakes">The great lakes of the Alps</a></li>
<li><a href="/danube-cruise">A cruise down the Danube from Vienna to Budapest</a></li><li><a href="/deserts">Deserts of Asia</a></li></ul></aside>
<footer>© 2024 Geo Weekly · <a href="/about">About</a> · <a href="/contact">Contact</a></footer>
</body></html>"""


@pytest.fixture
def web_config(tmp_path) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, web_fetch_timeout=2.0,
                             web_max_bytes=200_000)


def html(body: str | bytes, content_type: str = "text/html; charset=utf-8"):
    data = body.encode() if isinstance(body, str) else body
    return lambda h: send(h, 200, data, content_type)


def scrape(config, items, max_tokens=1000, **kwargs):
    return scrape_urls(items, max_tokens, config=config, embedder=HashEmbedder(), **kwargs)


def fits(answer: dict, max_tokens: int) -> bool:
    counter = TokenCounter()
    structured = {k: v for k, v in answer.items() if k != "text"}
    return counter.count(answer["text"]) <= max_tokens and counter.count(to_json(structured)) <= max_tokens


def test_query_returns_the_answering_passages_as_original_text(loopback_only, web_config):
    with LocalServer({"/rivers": html(ARTICLE)}) as server:
        answer = scrape(web_config, [{"url": server.url("/rivers"), "query": "Danube length countries capitals"}], 200)
        # The no-query answer is the extracted page in order: the same passages, at the same offsets.
        whole = scrape(web_config, [server.url("/rivers")], 4000)["results"][0]["passages"]
    (result,) = answer["results"]
    assert result["outcome"] == "ok" and result["title"] == "Rivers of Europe | Geo Weekly"
    texts = [p["text"] for p in result["passages"]]
    assert any("2,850 kilometres" in t for t in texts)
    assert not any("cookies" in t or "Log in" in t for t in texts)
    danube = next(p for p in result["passages"] if "2,850 kilometres" in p["text"])
    # The h1 begins the page's title, which the answer's header shows: the path goes on without it.
    assert f"[The Danube]\n{danube['text']}" in answer["text"] and "Rivers of Europe >" not in answer["text"]
    assert fits(answer, 200)
    assert whole[0]["text"].startswith("Europe has thousands")
    # A passage is {text, start}: its end is start + len(text), and its heading is framed in the text only.
    assert all(set(p) == {"text", "start"} for p in result["passages"] + whole)
    for passage in result["passages"]:  # each passage lies in the whole page's text, at its offset
        end = passage["start"] + len(passage["text"])
        window = next(w for w in whole if w["start"] <= passage["start"] and end <= w["start"] + len(w["text"]))
        assert window["text"][passage["start"] - window["start"]:end - window["start"]] == passage["text"]


def test_without_query_the_page_comes_in_order_and_is_cut_at_the_budget(loopback_only, web_config):
    with LocalServer({"/rivers": html(ARTICLE)}) as server:
        full = scrape(web_config, [{"url": server.url("/rivers"), "query": "*"}], 4000)
        small = scrape(web_config, [server.url("/rivers")], 120)
    passages = full["results"][0]["passages"]
    assert [p["start"] for p in passages] == sorted(p["start"] for p in passages)
    assert f"[Rivers of Europe]\n{passages[0]['text']}" in full["text"]
    assert "| Volga | 3,530 |" in passages[-1]["text"]  # tables survive as Markdown
    assert "Related articles" not in full["text"] and "© 2024" not in full["text"]
    assert not full["truncated"]
    assert small["truncated"] and fits(small, 120)
    shown = small["results"][0]["passages"]  # the page from its start, whole units up to the budget
    assert shown[:-1] == passages[:len(shown) - 1] and shown[-1]["start"] == passages[len(shown) - 1]["start"]
    assert passages[len(shown) - 1]["text"].startswith(shown[-1]["text"])


def test_related_links_are_ranked_against_the_query(loopback_only, web_config):
    with LocalServer({"/rivers": html(ARTICLE)}) as server:
        answer = scrape(web_config, [{"url": server.url("/rivers"), "query": "Danube cruise Vienna Budapest"}], 1000)
    links = answer["results"][0]["links"]
    assert links[0] == {"url": server.url("/danube-cruise"), "text": "A cruise down the Danube from Vienna to Budapest"}


def test_one_budget_is_shared_by_all_items(loopback_only, web_config):
    with LocalServer({"/a": html(ARTICLE), "/b": html(ARTICLE.replace("Rivers", "Streams"))}) as server:
        items = [{"url": server.url("/a"), "query": "Volga"}, {"url": server.url("/b"), "query": "Rhine flooding"}]
        for budget in (400, 800, 1600):
            answer = scrape(web_config, items, budget)
            assert fits(answer, budget)
            assert all(r["passages"] for r in answer["results"]), budget  # each page gets its best passage first


def test_outcomes_per_item_never_an_exception(loopback_only, web_config, monkeypatch):
    routes = {
        "/ok": html(ARTICLE),
        "/missing": lambda h: send(h, 404, b"gone", "text/plain"),
        "/error": lambda h: send(h, 503, b"down", "text/plain"),
        "/image": html(b"\x89PNG\r\n\x1a\n" + bytes(100), "image/png"),
        "/empty": html("<html><head><title>t</title><script>document.write('hi')</script></head><body> </body></html>"),
        "/loop": redirect("/loop"),
    }
    with LocalServer(routes) as server:
        items = [server.url(p) for p in ("/missing", "/error", "/image", "/empty", "/loop")]
        answer = scrape(web_config, items, 1000)
        outcomes = [(r["outcome"], r.get("status")) for r in answer["results"]]
        assert outcomes == [("http_error", 404), ("http_error", 503), ("unsupported_type", None), ("empty", None),
                            ("http_error", None)]
        bad = scrape(web_config, ["javascript:alert(1)", "file:///etc/passwd", "data:text/html,hi", "http://[::1", server.url("/ok")])
        assert [r["outcome"] for r in bad["results"]] == ["blocked", "blocked", "blocked", "invalid", "ok"]
        assert "file:///etc/passwd" in bad["text"] and "blocked" in bad["text"]


def test_private_addresses_refused_end_to_end_including_redirect_hops(loopback_only, tmp_path, monkeypatch):
    # 127.0.0.1 counts as public here so that the other loopback notations are the only refusals.
    monkeypatch.setattr(guard_mod, "classify", lambda a: "public" if str(a) == "127.0.0.1" else classify(a))
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", web_fetch_timeout=2.0)
    with LocalServer({"/ok": html(ARTICLE)}) as server:
        server.routes["/hop"] = redirect(f"http://0x7f000002:{server.port}/ok")
        server.routes["/meta"] = redirect("http://169.254.169.254/latest/meta-data/")
        items = [server.url("/ok", "127.2"), server.url("/ok", "[::ffff:127.0.0.2]"), server.url("/hop"), server.url("/meta"),
                 server.url("/ok")]
        answer = scrape(config, items, 1000)
        assert [r["outcome"] for r in answer["results"]] == ["blocked", "blocked", "blocked", "blocked", "ok"]
        assert [r["path"] for r in server.requests].count("/ok") == 1


def test_allow_private_hosts_off_refuses_the_local_server(loopback_only, tmp_path):
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db")
    with LocalServer({"/ok": html(ARTICLE)}) as server:
        for host in ("127.0.0.1", "localhost", "2130706433", "0x7f000001"):
            answer = scrape(config, [server.url("/ok", host)])
            assert answer["results"][0]["outcome"] == "blocked", host
        assert server.requests == []


def slowloris(h):
    h.send_response(200)
    h.send_header("Content-Type", "text/html")
    h.end_headers()
    for _ in range(200):
        h.wfile.write(b"<p>a")
        h.wfile.flush()
        time.sleep(0.2)


def endless(h):
    h.send_response(200)
    h.send_header("Content-Type", "text/html")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    chunk = b"<p>" + b"spam " * 2000 + b"</p>"
    while True:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))


def gzip_bomb():
    """A ~50 KB gzip body of 50 MB. Compressed before the server starts: compressing in the handler took
    longer than web_fetch_timeout on a loaded machine, and the outcome was the server's slowness."""
    body = gzip.compress(b"<html><body><p>" + b"A" * 50_000_000, compresslevel=9)
    return lambda h: send(h, 200, body, "text/html", {"Content-Encoding": "gzip"})


def silent(h):
    time.sleep(5)


def test_hostile_servers_are_bounded_in_time_and_memory(loopback_only, web_config):
    routes = {"/slow": slowloris, "/endless": endless, "/bomb": gzip_bomb(), "/silent": silent,
              "/huge": lambda h: send(h, 200, b"x" * 300_000, "text/plain")}
    with LocalServer(routes) as server:
        started = time.monotonic()
        answer = scrape(web_config, [server.url(p) for p in ("/slow", "/endless", "/bomb", "/silent", "/huge")], 500)
        elapsed = time.monotonic() - started
    assert [r["outcome"] for r in answer["results"]] == ["timeout", "too_large", "too_large", "timeout", "too_large"], answer["text"]
    assert elapsed < 30  # generous: the bound is web_fetch_timeout (2 s), concurrently, plus a loaded machine


def test_gzip_is_decoded_within_the_limit(loopback_only, web_config):
    body = gzip.compress(ARTICLE.encode())
    with LocalServer({"/gz": lambda h: send(h, 200, body, "text/html", {"Content-Encoding": "gzip"})}) as server:
        answer = scrape(web_config, [{"url": server.url("/gz"), "query": "Volga"}], 300)
    assert answer["results"][0]["outcome"] == "ok" and "Volga" in answer["text"]


def test_malformed_html_and_wrong_charsets(loopback_only, web_config):
    latin = "<html><body><article><h1>Café</h1><p>Crème brûlée à la française, " + "très bon. " * 20 + "</p></article></body></html>"
    routes = {
        "/broken": html("<html><body><div><p>Unclosed <b>tags <i>everywhere<table><tr><td>cell<p>" + "text " * 80 + "<<<>>></div"),
        "/lying-utf8": html(latin.encode("latin-1"), "text/html; charset=utf-8"),
        "/lying-latin1": html(latin.encode("utf-8"), "text/html; charset=iso-8859-1"),
        "/unknown-charset": html(latin.encode("utf-8"), "text/html; charset=x-klingon"),
        "/nul": html(b"<html><body><p>a\x00b" + b"word " * 60 + b"</p></body></html>"),
    }
    with LocalServer(routes) as server:
        answer = scrape(web_config, [server.url(p) for p in routes], 2000)
    results = answer["results"]
    assert results[0]["outcome"] in ("ok", "empty")
    for result in results[1:4]:
        assert result["outcome"] == "ok"
        assert "Crème brûlée" in result["passages"][0]["text"] or "Crème brûlée" in result["passages"][1]["text"]
    assert results[4]["outcome"] in ("ok", "empty")


def test_decode_body_prefers_boms_valid_utf8_then_declared_charsets():
    assert decode_body("é".encode("utf-8"), "iso-8859-1") == "é"
    assert decode_body("é".encode("latin-1"), "utf-8") == "é"  # not UTF-8: cp1252 fallback
    assert decode_body("Ж".encode("koi8-r"), "koi8-r") == "Ж"
    assert decode_body(b'<meta charset="koi8-r">' + "Ж".encode("koi8-r"), None) .endswith("Ж")
    assert decode_body("hi".encode("utf-16"), "utf-8") == "hi"


def test_bad_requests_are_typed_errors(web_config):
    with pytest.raises(InvalidInputError):
        scrape(web_config, [])
    with pytest.raises(InvalidInputError):
        scrape(web_config, ["http://a.test/"] * 6)
    with pytest.raises(InvalidInputError):
        scrape(web_config, [{"url": "http://a.test/", "extra": 1}])
    with pytest.raises(RecallBudgetError):
        scrape(web_config, ["http://a.test/"], 10)
    with pytest.raises(InvalidInputError):
        scrape(web_config, ["http://a.test/"], order="random")


def test_fetch_step_is_pluggable(web_config):
    from tinycontext.web.fetch import FetchResult

    class FakeFetcher:
        def __init__(self):
            self.urls = []

        async def fetch(self, url):
            self.urls.append(url)
            return FetchResult(url=url, final_url=url, status=200, content_type="text/html", body=ARTICLE.encode())

        async def aclose(self):
            pass

    fetcher = FakeFetcher()
    answer = scrape_urls([{"url": "https://example.org/rivers", "query": "Volga Caspian"}], 300, config=web_config,
                         fetcher=fetcher, embedder=HashEmbedder(), order="rank")
    assert fetcher.urls == ["https://example.org/rivers"]
    assert "Caspian" in answer["results"][0]["passages"][0]["text"]


def test_an_unchanged_page_is_not_read_again(web_config, monkeypatch):
    """The page cache is keyed by the body's hash (and URL, type, caps): the same page asked again is not
    extracted and chunked again, and answers the same; a changed page is read anew."""
    from tinycontext.web import scrape as scrape_mod
    from tinycontext.web.fetch import FetchResult

    bodies = [ARTICLE, ARTICLE, ARTICLE.replace("<title>Rivers of Europe", "<title>Rivers of Europe, revised")]
    extracted = []
    real_extract = scrape_mod.extract_page
    monkeypatch.setattr(scrape_mod, "extract_page", lambda *a, **k: extracted.append(1) or real_extract(*a, **k))

    class Fetcher:
        async def fetch(self, url):
            return FetchResult(url=url, final_url=url, status=200, content_type="text/html", body=bodies.pop(0).encode())

        async def aclose(self):
            pass

    scrape_mod.clear_page_cache()
    ask = [{"url": "https://example.org/rivers", "query": "How long is the Volga?"}]
    answers = [scrape_urls(ask, 300, config=web_config, fetcher=Fetcher(), embedder=HashEmbedder()) for _ in range(3)]
    assert len(extracted) == 2 and answers[0] == answers[1]
    assert answers[2]["results"][0]["title"].startswith("Rivers of Europe, revised")
    assert answers[0]["results"][0]["title"].startswith("Rivers of Europe | ")


def test_a_page_asked_again_sends_nothing_to_an_embedding_server(loopback_only, web_config, real_embedder):
    """With an OpenAI-compatible embedder the page's units are embedded once: the same page at another
    budget sends nothing, and a new question sends only itself."""
    from fake_embed_server import embed_server
    from tinycontext.models.remote import RemoteEmbedder
    from tinycontext.web import scrape as scrape_mod

    scrape_mod.clear_page_cache()
    with embed_server(real_embedder) as vectors, LocalServer({"/rivers": html(ARTICLE)}) as pages:
        embedder = RemoteEmbedder(vectors.url, "minilm-test", query_params={"input_type": "query"},
                                  document_params={"input_type": "passage"})
        ask = [{"url": pages.url("/rivers"), "query": "How long is the Volga?"}]
        vectors.requests.clear()
        cold = scrape_urls(ask, 300, config=web_config, embedder=embedder)
        assert {r["input_type"] for r in vectors.requests} == {"query", "passage"}
        vectors.requests.clear()
        warm = scrape_urls(ask, 500, config=web_config, embedder=embedder)
        assert vectors.requests == []
        scrape_urls([{**ask[0], "query": "Where does the Rhine rise?"}], 300, config=web_config, embedder=embedder)
        assert [(r["input"], r["input_type"]) for r in vectors.requests] == [(["Where does the Rhine rise?"], "query")]
        embedder.close()
    assert cold["results"][0]["outcome"] == warm["results"][0]["outcome"] == "ok"
    assert any("3,530 kilometres" in p["text"] for p in warm["results"][0]["passages"])


TOWNS = ["Ulm", "Ingolstadt", "Regensburg", "Passau", "Linz", "Krems", "Vienna", "Bratislava", "Komarno", "Esztergom",
         "Vukovar", "Novi Sad"]


def test_a_heading_is_named_once_and_units_of_a_section_are_one_window(loopback_only, tmp_path):
    long_section = "<h2>The Danube</h2>" + "".join(f"<p>Danube fact {i}: the river passes {town} on its way "
                                                   f"to the Black Sea, with a bridge and a harbour.</p>"
                                                   for i, town in enumerate(TOWNS))
    page = ARTICLE.replace("<h2>The Danube</h2>", long_section)
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, scrape_chunk_tokens=40)
    with LocalServer({"/rivers": html(page)}) as server:
        whole = scrape(config, [{"url": server.url("/rivers"), "query": "*"}], 4000)
        some = scrape(config, [{"url": server.url("/rivers"), "query": "Passau and Vukovar"}], 300)
    danube = [p for p in whole["results"][0]["passages"] if "Danube fact" in p["text"]]
    assert len(danube) == 1 and all(f"Danube fact {i}:" in danube[0]["text"] for i in range(len(TOWNS)))
    assert whole["text"].count("[The Danube]") == 1 and f"[The Danube]\n{danube[0]['text']}" in whole["text"]
    facts = [p for p in some["results"][0]["passages"] if "Danube fact" in p["text"]]
    assert len(facts) >= 2 and f"[The Danube]\n{facts[0]['text']}" in some["text"]
    assert some["text"].count("[The Danube]") == 1 and all(f"[…]\n{p['text']}" in some["text"] for p in facts[1:])
    assert fits(whole, 4000) and fits(some, 300)


def test_the_budget_left_by_merged_windows_goes_to_the_next_best_units():
    """Units ranked apart, then their neighbours: each was priced as a window of its own, yet they show
    as one window per section. What that frees is filled, up to less than one more unit."""
    from tinycontext.web.chunk import chunk_markdown
    from tinycontext.web.fetch import FetchResult
    from tinycontext.web.pages import PageResult, ScrapeItem
    from tinycontext.web.present import scrape_page

    counter = TokenCounter()
    markdown = "\n\n".join(f"## Port {s}\n\n" + "\n\n".join(f"Fact {s}.{i}: barges unload grain at quay {i} of port {s}."
                                                              for i in range(12)) for s in range(8))
    chunks = chunk_markdown(markdown, counter, max_tokens=256, passage_tokens=40)
    ranked = sorted(chunks, key=lambda c: (c.position % 2, c.position))  # every other unit first, then the rest
    page = PageResult(ScrapeItem("http://x/p", "grain"), FetchResult(url="http://x/p", final_url="http://x/p"), "ok",
                      title="Ports", chunks=ranked)
    for budget in (300, 700, 1500):
        fitted = scrape_page([page], max_tokens=budget, counter=counter, links_max_tokens=0)
        assert fitted.tokens <= budget
        unit = max(c.tokens for c in chunks)
        # Less than a unit and its window's keys and offsets is left, in the form that binds.
        assert budget - fitted.tokens < unit + 20, (budget, fitted.text_tokens, fitted.structured_tokens)


def test_a_heading_framed_only_by_a_unit_given_back_is_priced_again():
    """The heading "Opening hours" comes twice, so its second unit is priced without a frame yet shown with
    one; the round overshoots and gives back its last unit, the tolls under a long heading. A later round
    must price that heading again: taken as already shown, the tolls are retried and given back again, and
    the notes that would fit in their place are left out."""
    from tinycontext.web.chunk import chunk_markdown
    from tinycontext.web.fetch import FetchResult
    from tinycontext.web.pages import PageResult, ScrapeItem
    from tinycontext.web.present import scrape_page

    counter = TokenCounter()
    hours = "Opening hours of the harbour offices and the customs sheds along the quay"
    tolls = "Tolls paid by barges that carry grain, coal and timber from the upper river to the sea ports"
    markdown = (f"## {hours}\n\nThe office opens at eight.\n\n## Fees\n\nA berth costs ten crowns.\n\n"
                f"## {hours}\n\nThe sheds close at six.\n\n## {tolls}\n\nEach barge pays by the tonne at the lock.\n\n"
                "## Notes\n\n" + "\n\n".join(f"Note {i}: quay {i} is dredged." for i in range(8)))
    chunks = chunk_markdown(markdown, counter, max_tokens=256, passage_tokens=40)
    page = PageResult(ScrapeItem("http://x/p", "quay"), FetchResult(url="http://x/p", final_url="http://x/p"), "ok",
                      title="Port", chunks=chunks)  # ranked in page order
    unit = max(c.tokens for c in chunks)
    for budget in range(150, 201):
        fitted = scrape_page([page], max_tokens=budget, counter=counter, links_max_tokens=0)
        assert counter.count(fitted.text) <= budget and counter.count(to_json(fitted.structured)) <= budget
        # Less than a note and its window's keys and offsets is left, in the form that binds.
        assert budget - fitted.tokens < unit + 20, (budget, fitted.chosen, fitted.text_tokens, fitted.structured_tokens)


def test_a_window_is_left_out_only_when_it_does_not_fit():
    """Units that never merge (the page's every other paragraph), each a window of its own, at every budget
    from 100 to 400: what is left, in the form that binds, is less than one more window as it would be
    received (its text and keys) and a few tokens; a high estimate of a window's keys leaves one out that fits."""
    from tinycontext.web.chunk import chunk_markdown
    from tinycontext.web.fetch import FetchResult
    from tinycontext.web.pages import PageResult, ScrapeItem
    from tinycontext.web.present import scrape_page

    counter = TokenCounter()
    markdown = "\n\n".join(f"Fact {i}: barges unload {'grain and ' * (i % 4)}coal at quay {i}." for i in range(40))
    apart = [c for c in chunk_markdown(markdown, counter, max_tokens=256, passage_tokens=40) if c.position % 2 == 0]
    page = PageResult(ScrapeItem("http://x/p", "coal"), FetchResult(url="http://x/p", final_url="http://x/p"), "ok",
                      title="Quays", chunks=apart)
    for budget in range(100, 401):
        fitted = scrape_page([page], max_tokens=budget, counter=counter, links_max_tokens=0)
        assert counter.count(fitted.text) <= budget and counter.count(to_json(fitted.structured)) <= budget
        shown = {p["start"] for p in fitted.structured["results"][0]["passages"]}
        for unit in (c for c in apart if c.start not in shown):
            entry = counter.count(to_json({"text": unit.text, "start": unit.start})) + 1  # and its comma
            line = counter.count("[…]\n" + unit.text) + 1
            assert budget - fitted.structured_tokens < entry + 5 or budget - fitted.text_tokens < line + 5, \
                (budget, unit.position, fitted.text_tokens, fitted.structured_tokens)


def test_a_passage_next_to_a_good_one_in_its_section_moves_up():
    from tinycontext.web.rank import boost_neighbours

    order = [(2, 0.5), (0, 0.3), (3, 0.2), (1, 0.1)]
    sections = ["a", "a", "a", "b"]  # passage 3 starts another section: no gain from passage 2
    assert [p for p, _ in boost_neighbours(order, sections, 0.0)] == [2, 0, 3, 1]
    boosted = boost_neighbours(order, sections, 0.5)
    assert [p for p, _ in boosted] == [2, 0, 1, 3]
    assert dict(boosted)[1] == pytest.approx(0.1 + 0.5 * 0.5) and dict(boosted)[3] == 0.2


def roman_bridges_page():
    """Passages of a page whose answer to "roman bridges" is one sentence at the end of a long passage under
    "Bridges", after 20 sections that each match "roman"; and that passage's position."""
    from tinycontext.web.chunk import chunk_markdown

    sites = "".join(f"## Site {k}\n\nVisitors see Roman coins and pottery at site number {k}.\n\n" for k in range(20))
    markdown = ("# Europe\n\n" + sites + "## Bridges\n\nTolls were collected at each end, and the guilds paid for the "
                "upkeep every spring.\n\nCarts crossed them daily, the town grew around the market square, and fairs "
                "were held there twice a year. The stone ones over the river date from Roman times.")
    chunks = chunk_markdown(markdown, TokenCounter(), max_tokens=40, passage_tokens=40)
    answer = next(i for i, c in enumerate(chunks) if "Roman times" in c.text)
    return chunks, answer


def test_a_passage_whose_one_sentence_answers_moves_up():
    """Scored whole, a long passage with one answering sentence ranks last; its sentence, read with its
    heading path ("Bridges"), is the best unit of the page and lifts it (BM25 alone: no model needed)."""
    from tinycontext.web.rank import rank_chunks

    chunks, answer = roman_bridges_page()
    assert len(chunks[answer].units) == 2  # longer than half a passage: its sentences are scored too

    def place(unit_weight: float) -> int:
        config = TinyContextConfig(scrape_unit_weight=unit_weight, scrape_neighbour_weight=0.0)
        return [i for i, _ in rank_chunks("roman bridges", chunks, None, config)].index(answer)

    assert place(0.0) >= 15  # passages alone: below the sites that match "roman"
    assert place(0.5) < 10


class CountingEmbedder(HashEmbedder):
    def __init__(self):
        super().__init__()
        self.documents: list[str] = []

    def embed_documents(self, texts, progress=False):
        self.documents += texts
        return super().embed_documents(texts)


def test_only_the_units_of_passages_chosen_by_bm25_are_embedded():
    """A page new to the embedder costs the units of a few passages, not the page twice: every unit is ranked
    by BM25, only the units of scrape_unit_candidates passages (BM25's best passages and the owners of its best
    units, in turn) are embedded, never the passages' own texts; a larger budget embeds more of them."""
    from tinycontext.web.rank import rank_chunks

    chunks, answer = roman_bridges_page()
    config = TinyContextConfig(scrape_unit_candidates=3, scrape_neighbour_weight=0.0)
    embedder = CountingEmbedder()
    order = [i for i, _ in rank_chunks("roman bridges", chunks, embedder, config)]
    owners = {next(c.passage for c in chunks if text.split("\n", 1)[1] in c.text) for text in embedder.documents}
    assert len(owners) == 3 and chunks[answer].passage in owners  # its sentence is BM25's best unit
    assert len(embedder.documents) == sum(len(c.units) for c in chunks if c.passage in owners)
    assert all(text.startswith("Europe > ") for text in embedder.documents)  # units read with their heading path
    assert order.index(answer) < 3
    wide = CountingEmbedder()
    rank_chunks("roman bridges", chunks, wide, config, budget=2 * config.scrape_passage_tokens)
    assert len(wide.documents) > len(embedder.documents)
    # The pages of one call share its candidates, as they share its budget: one of three pages embeds one passage's units.
    shared = CountingEmbedder()
    rank_chunks("roman bridges", chunks, shared, config, pages=3)
    assert len({next(c.passage for c in chunks if t.split("\n", 1)[1] in c.text) for t in shared.documents}) == 1


def test_budgets_from_one_thousand_tokens_embed_twice_the_candidates_per_fitting_passage():
    """Up to LARGE_BUDGET the depth is CANDIDATES_PER_FIT passages per passage the budget holds (the 500-token
    path's cost is unchanged); from it on, LARGE_BUDGET_CANDIDATES_PER_FIT: long pages' second thousand tokens."""
    from tinycontext.web import rank
    from tinycontext.web.chunk import chunk_markdown

    markdown = "# Harbour\n\n" + "".join(f"## Boat {k}\n\nThe boat number {k} had nets mended on the quay in winter.\n\n"
                                          for k in range(400))
    chunks = chunk_markdown(markdown, TokenCounter(), max_tokens=40, passage_tokens=40)
    config = TinyContextConfig(scrape_unit_candidates=0, scrape_neighbour_weight=0.0, scrape_max_chunks=1000)

    def passages_embedded(budget: int) -> int:
        embedder = CountingEmbedder()
        rank.rank_chunks("boat nets quay", chunks, embedder, config, budget=budget)
        return len({next(c.passage for c in chunks if t.split("\n", 1)[1] in c.text) for t in embedder.documents})

    size = config.scrape_passage_tokens
    assert passages_embedded(500) == math.ceil(rank.CANDIDATES_PER_FIT * 500 / size)
    assert passages_embedded(rank.LARGE_BUDGET - 1) == math.ceil(rank.CANDIDATES_PER_FIT * (rank.LARGE_BUDGET - 1) / size)
    assert passages_embedded(2000) == math.ceil(rank.LARGE_BUDGET_CANDIDATES_PER_FIT * 2000 / size)


def test_every_unit_is_ranked_and_scrape_max_chunks_bounds_only_those_embedded(loopback_only, web_config):
    """A page with more units than scrape_max_chunks is read whole: an answer in its last paragraph comes back
    (BM25 ranks every unit), while at most scrape_max_chunks texts are embedded, whatever the budget's depth."""
    filler = "".join(f"<p>Note {k}: the harbour had {k + 3} boats, and their nets were mended on the quay each winter.</p>"
                     for k in range(60))
    page = (f"<html><head><title>Harbour</title></head><body><main><article><h1>Harbour log</h1>{filler}"
            "<p>The lighthouse keeper retired in 1987, after forty years on the rock.</p></article></main></body></html>")
    config = web_config.model_copy(update={"scrape_max_chunks": 10, "scrape_unit_candidates": 1000})
    embedder = CountingEmbedder()
    with LocalServer({"/harbour": html(page)}) as server:
        answer = scrape_urls([{"url": server.url("/harbour"), "query": "When did the lighthouse keeper retire?"}], 4000,
                             order="rank", config=config, embedder=embedder)
    (result,) = answer["results"]
    assert result["outcome"] == "ok" and "note" not in result
    assert "The lighthouse keeper retired in 1987" in result["passages"][0]["text"]
    assert 0 < len(embedder.documents) <= 10
    assert fits(answer, 4000)


def test_links_that_share_no_word_with_the_query_are_left_out(loopback_only, web_config):
    with LocalServer({"/rivers": html(ARTICLE)}) as server:
        answer = scrape(web_config, [{"url": server.url("/rivers"), "query": "Volga basin population"}], 1000)
        whole = scrape(web_config, [server.url("/rivers")], 1000)
    assert "links" not in answer["results"][0]  # navigation, footer and unrelated articles cost nothing
    assert len(whole["results"][0]["links"]) > 3  # without a query the page's links come in page order


def test_content_is_sniffed_and_undeclared_charsets_detected(loopback_only, web_config):
    """A PDF is read as a PDF whatever its label; binary labelled text/html is not text; a Shift-JIS page
    without any charset decodes and is cut into passages of at most the chunk size."""
    from test_web_pdf import make_pdf

    pdf = make_pdf([[(18, 72, "Sniffed report"), (11, 72, "The Danube delta is a wetland of reed beds and channels.")]])
    japanese = "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。" * 30
    sjis = f"<html><head><title>東京</title></head><body><main><article><h1>東京</h1><p>{japanese}</p></article></main></body></html>"
    routes = {
        "/pdf-as-html": html(pdf, "text/html; charset=utf-8"),
        "/pdf-untyped": html(pdf, ""),
        "/binary-as-html": html(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 40, "text/html"),
        "/sjis": html(sjis.encode("shift_jis"), "text/html"),
    }
    with LocalServer(routes) as server:
        answer = scrape(web_config, [server.url(p) for p in routes], 3000)
    pdf_as_html, pdf_untyped, binary, japanese_page = answer["results"]
    for result in (pdf_as_html, pdf_untyped):
        assert result["outcome"] == "ok" and any("reed beds" in p["text"] for p in result["passages"]), result
    assert binary["outcome"] == "unsupported_type" and "binary" in binary["detail"]
    assert japanese_page["outcome"] == "ok" and japanese_page["title"] == "東京"
    assert "世界で最も人口の多い都市圏" in japanese_page["passages"][0]["text"]
    # Cut into units of at most the chunk size (tests/test_web_extract.py), so a small budget still answers.
    with LocalServer({"/sjis": html(sjis.encode("shift_jis"), "text/html")}) as server:
        small = scrape(web_config, [{"url": server.url("/sjis"), "query": "東京 首都"}], 500)
    assert small["results"][0]["passages"] and "東京は日本の首都" in small["text"]


def big_page(size: int = 4_900_000) -> bytes:
    """A long article (one paragraph after another) of about ``size`` bytes, under web_max_bytes."""
    words = "river delta barge grain port city bridge water valley mountain snow trade route canal lock ferry".split()
    paragraph = lambda i: "<p>" + " ".join(words[(i * 7 + j) % len(words)] for j in range(120)) + f" number {i}.</p>\n"  # noqa: E731
    paragraphs, total = [], 0
    while total < size - 200:
        paragraphs.append(paragraph(len(paragraphs)))
        total += len(paragraphs[-1])
    paragraphs[10] = "<p>The flood reached the river mouth in May, and the harbour closed for a week.</p>\n"
    return ("<html><head><title>Big</title></head><body><main><article><h1>Big page</h1>" + "".join(paragraphs)
            + "</article></main></body></html>").encode()


class BlockedEmbedder(HashEmbedder):
    """Embeds only once ``release`` is set (at most 60 s): ranking that outlives the item's deadline."""

    def __init__(self):
        super().__init__()
        import threading

        self.release = threading.Event()

    def embed(self, texts, kind="document", progress=False):
        self.release.wait(60)
        return super().embed(texts, kind, progress)

    def embed_query(self, text):  # one call that cannot be cut short: only the item's hard deadline ends it
        return self.embed([text], "query")[0]


def test_a_long_page_is_read_whole_by_default(loopback_only, web_config):
    """A page of ~130,000 characters (the size of two LoCoMo chat archives) is read to its end: the answer is its last paragraph."""
    words = "river delta barge grain port city bridge water valley mountain snow trade route canal lock ferry".split()
    paragraphs = ["<p>" + " ".join(words[(i * 7 + j) % len(words)] for j in range(100)) + f" number {i}.</p>" for i in range(200)]
    body = ("<html><head><title>Long</title></head><body><main><article><h1>Long page</h1>" + "".join(paragraphs)
            + "<p>The lighthouse keeper retired in 1987 after forty winters.</p></article></main></body></html>")
    config = web_config.model_copy(update={"web_max_bytes": 1_000_000})
    with LocalServer({"/long": html(body)}) as server:
        answer = scrape(config, [{"url": server.url("/long"), "query": "when did the lighthouse keeper retire"}], 500)
    (result,) = answer["results"]
    last = result["passages"][-1]
    assert "note" not in result and last["start"] + len(last["text"]) > 120_000
    assert any("retired in 1987" in p["text"] for p in result["passages"])


def test_a_huge_page_is_read_up_to_the_caps_and_within_the_item_deadline(loopback_only, tmp_path):
    body = big_page()
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, web_max_bytes=5_000_000,
                               web_item_timeout=60, scrape_max_chars=20_000, scrape_max_chunks=60)
    with LocalServer({"/big": html(body)}) as server:
        item = {"url": server.url("/big"), "query": "when did the flood reach the river mouth"}
        answer = scrape_urls([item], 800, order="rank", config=config.model_copy(update={"embedding_backend": "none"}))
        (result,) = answer["results"]
        assert result["outcome"] == "ok" and "scrape_max_chars" in result["note"]
        assert "The flood reached the river mouth in May" in result["passages"][0]["text"]
        assert max(p["start"] + len(p["text"]) for p in result["passages"]) <= 20_000
        # Ranking that would take longer than web_item_timeout: the item is a timeout, and the answer
        # comes while the embedder is still blocked (it is released only afterwards).
        blocked = BlockedEmbedder()
        try:
            late = scrape_urls([item], 800, config=config.model_copy(update={"web_item_timeout": 1.0}), embedder=blocked)
            assert not blocked.release.is_set()
        finally:
            blocked.release.set()
    (result,) = late["results"]
    assert result["outcome"] == "timeout" and "web_item_timeout=1" in result["detail"]


class SlowEmbedder(HashEmbedder):
    """Every call to embed documents takes ``seconds``: a model on a machine far too busy for the page."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds, self.calls = seconds, 0

    def embed_documents(self, texts, progress=False):
        self.calls += 1
        time.sleep(self.seconds)
        return super().embed_documents(texts)


def test_embedding_stops_at_the_soft_deadline_and_the_page_is_ranked_by_keywords(loopback_only, tmp_path):
    """Embedding every candidate would take 5 x 1.5 s, past web_item_timeout (4 s): embedding stops at 80% of
    it, the passages come back ranked by BM25 where no vector was made, and the answer says so."""
    from tinycontext.web.rank import EMBED_SLICE

    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, web_item_timeout=4.0,
                               scrape_unit_candidates=100_000)
    slow = SlowEmbedder(1.5)
    with LocalServer({"/big": html(big_page(400_000))}) as server:
        item = {"url": server.url("/big"), "query": "when did the flood reach the river mouth"}
        answer = scrape_urls([item], 800, order="rank", config=config, embedder=slow)
    (result,) = answer["results"]
    assert result["outcome"] == "ok" and "ranked partly by keywords" in result["note"], result
    assert "The flood reached the river mouth in May" in result["passages"][0]["text"]
    # ~500 paragraphs of one unit each, embedded EMBED_SLICE at a time: at most 3 slices start before 3.2 s.
    assert 1 <= slow.calls <= 3 and slow.calls * EMBED_SLICE < 400_000 // 800
    assert fits(answer, 800)


def test_a_5_mb_page_answers_within_web_item_timeout(loopback_only, tmp_path):
    """The 4.9 MB page under web_max_bytes, default caps and deadline, the suite's embedder (MiniLM with
    TINYCONTEXT_TEST_EMBEDDER=minilm): its best passages, or a typed timeout, within web_item_timeout
    (figures: notes/scrape_bounds.md)."""
    from conftest import suite_embedder

    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, web_max_bytes=5_000_000)
    body = big_page()
    assert 4_800_000 < len(body) < config.web_max_bytes
    with LocalServer({"/big": html(body)}) as server:
        item = {"url": server.url("/big"), "query": "when did the flood reach the river mouth"}
        started = time.monotonic()
        answer = scrape_urls([item], 1000, config=config, embedder=suite_embedder())
        elapsed = time.monotonic() - started
    (result,) = answer["results"]
    assert result["outcome"] in ("ok", "timeout"), result
    if result["outcome"] == "ok":
        assert "scrape_max_chars" in result["note"]
        assert any("The flood reached the river mouth in May" in p["text"] for p in result["passages"])
    assert elapsed < config.web_item_timeout + 2  # the deadline holds inside every stage (a loaded CI: +2 s)
    assert fits(answer, 1000)


def test_links_are_not_embedded_when_the_budget_leaves_them_no_room(loopback_only, web_config):
    """Below LINKS_FROM_TOKENS an answer carries no links, so a cold page does not pay to embed them."""
    from tinycontext.web.present import LINKS_FROM_TOKENS

    item = {"url": "", "query": "a cruise down the Danube from Vienna"}
    seen = {}
    with LocalServer({"/rivers": html(ARTICLE)}) as server:
        for budget in (LINKS_FROM_TOKENS // 2, LINKS_FROM_TOKENS):
            embedder = CountingEmbedder()
            answer = scrape_urls([{**item, "url": server.url("/rivers")}], budget, config=web_config, embedder=embedder)
            seen[budget] = any("/danube-cruise" in text for text in embedder.documents), "links" in answer["results"][0]
    assert seen == {LINKS_FROM_TOKENS // 2: (False, False), LINKS_FROM_TOKENS: (True, True)}

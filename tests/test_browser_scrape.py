"""scrape_urls with backend browser and auto: pages built by scripts, read through the real Chromium."""

from __future__ import annotations

import pytest

from netguard import LocalServer, loopback_only, send  # noqa: F401  (fixture)
from tinycontext import TinyContextConfig
from tinycontext.errors import InvalidInputError
from tinycontext.web.browser import close_services
from tinycontext.web.scrape import scrape_urls
from test_browser import needs_browser

STORY = ("The Danube flows 2,850 kilometres from the Black Forest to the Black Sea and passes through ten countries. "
         "Barges carry grain and containers between its ports, and four capital cities stand on its banks.")
# The server sends an empty shell; the article exists only after the script runs.
SHELL = f"""<!doctype html><html><head><meta charset=utf-8><title>Rivers</title></head><body><div id=app>Loading…</div>
<script>document.getElementById('app').innerHTML = '<main><article><h1>The Danube</h1><p>{STORY}</p><p>{STORY}</p></article></main>';</script>
</body></html>"""
STATIC = f"""<!doctype html><html><head><meta charset=utf-8><title>Static</title></head><body><main><article>
<h1>The Rhine</h1><p>{STORY.replace('Danube', 'Rhine')}</p><p>{STORY.replace('Danube', 'Rhine')}</p></article></main></body></html>"""


def page(body: str):
    return lambda h: send(h, 200, body.encode())


@pytest.fixture
def config(tmp_path):
    yield TinyContextConfig(memory_db_path=tmp_path / "m.db", allow_private_hosts=True, web_fetch_timeout=10.0)
    close_services()


def text_of(answer: dict, index: int) -> str:
    return " ".join(p["text"] for p in answer["results"][index]["passages"])


@needs_browser
def test_browser_and_auto_backends_read_script_built_pages(loopback_only, config):
    with LocalServer({"/shell": page(SHELL), "/static": page(STATIC)}) as server:
        items = [{"url": server.url("/shell")}, {"url": server.url("/static")}]
        http = scrape_urls(items, 2000, config=config, backend="http")
        assert "2,850 kilometres" not in text_of(http, 0) and "Rhine" in text_of(http, 1)  # the shell says "Loading…"
        before = [r["path"] for r in server.requests]
        auto = scrape_urls(items, 2000, config=config, backend="auto")
        assert [r["outcome"] for r in auto["results"]] == ["ok", "ok"]
        assert "2,850 kilometres" in text_of(auto, 0) and "Rhine" in text_of(auto, 1)
        fetched = [r["path"] for r in server.requests[len(before):]]
        # auto rendered only the shell in the browser; the static page was read once, over HTTP.
        assert fetched.count("/shell") == 2 and fetched.count("/static") == 1
        browser = scrape_urls([items[0]], 2000, config=config, backend="browser")
        assert browser["results"][0]["outcome"] == "ok" and "2,850 kilometres" in text_of(browser, 0)


@needs_browser
def test_browser_backend_keeps_the_guard_and_the_switch(loopback_only, tmp_path):
    strict = TinyContextConfig(memory_db_path=tmp_path / "m.db")
    try:
        with LocalServer({"/shell": page(SHELL)}) as server:
            answer = scrape_urls([{"url": server.url("/shell")}], 1000, config=strict, backend="browser")
            assert answer["results"][0]["outcome"] == "blocked" and not server.requests
    finally:
        close_services()
    off = strict.model_copy(update={"browser_backend": "off"})
    with pytest.raises(InvalidInputError, match="browser_backend=off"):
        scrape_urls([{"url": "https://example.org/"}], 1000, config=off, backend="auto")
    with pytest.raises(InvalidInputError, match="backend must be one of"):
        scrape_urls([{"url": "https://example.org/"}], 1000, config=strict, backend="selenium")

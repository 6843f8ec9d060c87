"""search: a fake SearXNG on loopback and a patched ddgs; outcomes, domains, budget, fallback."""

from __future__ import annotations

import json
import os
from urllib.parse import parse_qs, urlsplit

import pytest

from netguard import LocalServer, loopback_only, send  # noqa: F401  (fixture)
from tinycontext import TinyContextConfig
from tinycontext.budget.tokens import TokenCounter
from tinycontext.errors import InvalidInputError
from tinycontext.budget.render import to_json
from tinycontext.web import search

RESULTS = [
    {"title": "Danube - Wikipedia", "url": "https://en.wikipedia.org/wiki/Danube", "content": "The Danube is a river in Europe.",
     "publishedDate": "2024-01-02T00:00:00"},
    {"title": "Danube cruises", "url": "https://travel.example.com/danube", "content": "Cruise from Vienna."},
    {"title": "Danube on a blog", "url": "https://blog.example.org/danube", "content": "Notes."},
    {"title": "Evil", "url": "javascript:alert(1)", "content": "not a web page"},
]


class FakeSearx:
    def __init__(self, status=200, results=RESULTS, body: bytes | None = None):
        self.status, self.results, self.body, self.queries = status, results, body, []

    def __call__(self, h):
        query = parse_qs(urlsplit(h.path).query)
        self.queries.append(query)
        body = self.body if self.body is not None else json.dumps({"query": query["q"][0], "results": self.results}).encode()
        send(h, self.status, body, "application/json")


def config_for(server, tmp_path, backend="searxng") -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "m.db", search_backend=backend, searxng_url=server.url(""))


def test_searxng_results_in_backend_order_with_outcome(loopback_only, tmp_path):
    fake = FakeSearx()
    with LocalServer({"/search": fake}) as server:
        answer = search([{"query": "danube river"}], config=config_for(server, tmp_path))
    (only,) = answer["searches"]
    assert only["outcome"] == "ok" and only["backend"] == "searxng"
    assert [r["url"] for r in only["results"]] == [r["url"] for r in RESULTS[:3]]  # javascript: dropped
    assert only["results"][0] == {"title": "Danube - Wikipedia", "url": "https://en.wikipedia.org/wiki/Danube",
                                  "snippet": "The Danube is a river in Europe.", "date": "2024-01-02T00:00:00"}
    assert fake.queries[0]["format"] == ["json"] and fake.queries[0]["q"] == ["danube river"]
    assert "Danube - Wikipedia (2024-01-02) <https://en.wikipedia.org/wiki/Danube>" in answer["text"]


def test_domains_keep_the_domain_and_its_subdomains(loopback_only, tmp_path):
    fake = FakeSearx()
    with LocalServer({"/search": fake}) as server:
        answer = search([{"query": "danube", "domains": ["example.com"]},
                         {"query": "danube", "domains": ["https://www.wikipedia.org/", "example.org"]}],
                        config=config_for(server, tmp_path))
    first, second = answer["searches"]
    assert [r["url"] for r in first["results"]] == ["https://travel.example.com/danube"]
    assert [r["url"] for r in second["results"]] == ["https://en.wikipedia.org/wiki/Danube", "https://blog.example.org/danube"]
    # The two searches run concurrently: compare what the backend was asked, in any order.
    assert sorted(q["q"][0] for q in fake.queries) == ["danube (site:wikipedia.org OR site:example.org)", "danube site:example.com"]


@pytest.mark.parametrize("fake, outcome", [
    (FakeSearx(results=[]), "no_results"),
    (FakeSearx(status=429), "blocked"),
    (FakeSearx(status=403), "blocked"),
    (FakeSearx(status=500), "unavailable"),
    (FakeSearx(body=b"<html>not json</html>"), "unavailable"),
    (FakeSearx(body=b'{"results": "nope"}'), "unavailable"),
])
def test_failed_backends_are_distinct_from_no_results(loopback_only, tmp_path, fake, outcome):
    with LocalServer({"/search": fake}) as server:
        answer = search(["anything"], config=config_for(server, tmp_path))
    assert answer["searches"][0]["outcome"] == outcome
    assert answer["searches"][0]["results"] == []


def test_unreachable_or_unset_searxng_is_unavailable(loopback_only, tmp_path):
    with LocalServer({}) as server:
        port = server.port
    config = TinyContextConfig(memory_db_path=tmp_path / "m.db", search_backend="searxng", searxng_url=f"http://127.0.0.1:{port}")
    assert search(["q"], config=config)["searches"][0]["outcome"] == "unavailable"
    unset = TinyContextConfig(memory_db_path=tmp_path / "m.db", search_backend="searxng")
    assert "not configured" in search(["q"], config=unset)["searches"][0]["detail"]


def test_invalid_items_get_their_own_outcome(loopback_only, tmp_path):
    fake = FakeSearx()
    with LocalServer({"/search": fake}) as server:
        answer = search([{"query": "  "}, {"query": "ok", "domains": ["not a domain!"]}, {"query": "fine"}],
                        config=config_for(server, tmp_path))
    assert [s["outcome"] for s in answer["searches"]] == ["invalid", "invalid", "ok"]
    assert len(fake.queries) == 1
    with pytest.raises(InvalidInputError):
        search([], config=TinyContextConfig(memory_db_path=tmp_path / "m.db"))
    with pytest.raises(InvalidInputError):
        search(["q"] * 6, config=TinyContextConfig(memory_db_path=tmp_path / "m.db"))


@pytest.fixture(autouse=True)
def no_real_ddgs(monkeypatch):
    """ddgs talks to the internet from Rust (sockets loopback_only cannot see): never let it run."""
    import ddgs.ddgs

    def refuse(self, *args, **kwargs):
        raise AssertionError("the real ddgs backend was called")

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", refuse)
    monkeypatch.setattr(ddgs.ddgs.DDGS, "_search_sync", refuse)


def fake_ddgs(monkeypatch, behaviour):
    import ddgs.ddgs

    calls = []

    def text(self, query, **kwargs):
        calls.append(query)
        if isinstance(behaviour, Exception):
            raise behaviour
        return behaviour

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", text)
    return calls


def test_ddgs_backend_and_its_failures(loopback_only, tmp_path, monkeypatch):
    from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

    config = TinyContextConfig(memory_db_path=tmp_path / "m.db")  # ddgs is the default backend
    calls = fake_ddgs(monkeypatch, [{"title": "T", "href": "https://docs.python.org/3/", "body": "Python docs"},
                                    {"title": "U", "href": "https://python.org/", "body": ""}])
    answer = search([{"query": "python docs", "domains": ["docs.python.org"]}], config=config)
    assert calls == ["python docs site:docs.python.org"]
    assert answer["searches"][0]["results"] == [{"title": "T", "url": "https://docs.python.org/3/", "snippet": "Python docs"}]
    for exc, outcome in [(RatelimitException("202 Ratelimit"), "blocked"), (TimeoutException("timed out"), "unavailable"),
                         (DDGSException("No results found."), "no_results"), (DDGSException("boom"), "unavailable")]:
        fake_ddgs(monkeypatch, exc)
        assert search(["q"], config=config)["searches"][0]["outcome"] == outcome, exc


def test_auto_falls_back_to_ddgs_when_searxng_fails(loopback_only, tmp_path, monkeypatch):
    fake_ddgs(monkeypatch, [{"title": "From ddgs", "href": "https://a.example/", "body": "x"}])
    with LocalServer({"/search": FakeSearx(status=500)}) as server:
        answer = search(["q"], config=config_for(server, tmp_path, backend="auto"))
    assert answer["searches"][0]["backend"] == "ddgs" and answer["searches"][0]["outcome"] == "ok"
    with LocalServer({"/search": FakeSearx()}) as server:
        answer = search(["q"], config=config_for(server, tmp_path, backend="auto"))
    assert answer["searches"][0]["backend"] == "searxng"


def test_answer_fits_max_tokens(loopback_only, tmp_path):
    many = [{"title": f"Result {i} " + "word " * 20, "url": f"https://site{i}.example/page", "content": "snippet " * 40}
            for i in range(30)]
    with LocalServer({"/search": FakeSearx(results=many)}) as server:
        config = config_for(server, tmp_path).model_copy(update={"search_max_results": 30})
        for budget in (100, 400, 1500):
            answer = search(["a", "b"], budget, config=config)
            counter = TokenCounter()
            assert counter.count(answer.pop("text")) <= budget
            assert counter.count(to_json(answer)) <= budget
            assert answer["truncated"]
            # Both queries get their first result before either gets a second.
            firsts = [s["results"][:1] for s in answer["searches"]]
            assert all(firsts) or budget == 100


@pytest.mark.skipif(not os.environ.get("TINYCONTEXT_ONLINE_TESTS"), reason="needs the internet (set TINYCONTEXT_ONLINE_TESTS=1)")
def test_real_ddgs_backend(tmp_path, monkeypatch):
    monkeypatch.undo()  # lift no_real_ddgs
    answer = search(["python programming language"], config=TinyContextConfig(memory_db_path=tmp_path / "m.db"))
    assert answer["searches"][0]["outcome"] in ("ok", "blocked")

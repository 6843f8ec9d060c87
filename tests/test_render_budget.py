"""The budget is what the agent receives: MCP text and structured content, REST body, CLI output.

The property test drives the real MCP server through the SDK's client (in-memory transport) with
random memories, tags, metadata, budgets and detail levels, and counts what came back with the
configured encoding.
"""

from __future__ import annotations

import itertools
import json

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared.memory import create_connected_server_and_client_session

from tinycontext import TinyContextConfig, close_engines
from tinycontext.budget.tokens import TokenCounter
from tinycontext.cli.commands import main
from tinycontext.budget.render import MIN_AGENT_TOKENS, fit_page, recall_page, to_json
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background
from tinycontext.servers.mcp_server import build_server

COUNTER = TokenCounter("o200k_base")
WORDS = ["deploy", "pnpm", "postgres", "billing", "cat", "Miso", "Fly.io", "review", "Tuesday", "budget", "日本語", "émigré", "🚀"]
CONTENT = st.lists(st.sampled_from(WORDS) | st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12),
                   min_size=1, max_size=60).map(" ".join).filter(str.strip)
TAGS = st.lists(st.sampled_from(["a", "prefs", "infra", "long-tag-" + "x" * 40, "ünï"]), max_size=4)
JSONISH = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.text(max_size=30)
METADATA = st.dictionaries(st.text(min_size=1, max_size=10), JSONISH | st.lists(JSONISH, max_size=4), max_size=5)
MEMORY = st.fixed_dictionaries({"content": CONTENT, "tags": TAGS, "metadata": METADATA}, optional={
    "speaker": st.sampled_from(["Ana", "Ben", "Dr. Ünal Kaya"]), "occurred_at": st.sampled_from(["2023-05-08", "2024-02-29T23:59"]),
    "attachments": st.lists(CONTENT, max_size=2)})
RATIOS: list[float] = []


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("budget")
    yield build_server(TinyContextConfig(memory_db_path=path / "memory.db", models_dir=path / "models"))
    close_engines()


def received(result) -> tuple[int, int]:
    text = "\n".join(block.text for block in result.content)
    return COUNTER.count(text), COUNTER.count(to_json(result.structuredContent))


SESSIONS = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(memories=st.lists(MEMORY, min_size=1, max_size=12), budget=st.integers(MIN_AGENT_TOKENS, 1500),
       top_k=st.integers(1, 15), detail=st.sampled_from(["compact", "full"]), query=st.sampled_from(WORDS),
       tag=st.none() | st.sampled_from(["a", "prefs"]))
def test_mcp_answer_never_exceeds_max_tokens(server, memories, budget, top_k, detail, query, tag):
    session_id = f"s{next(SESSIONS)}"

    async def scenario():
        async with create_connected_server_and_client_session(server) as client:
            saved = await client.call_tool("save_memories", {"memories": memories, "session_id": session_id})
            assert not saved.isError, saved.content[0].text
            args = {"query": query, "session_id": session_id, "max_tokens": budget, "top_k": top_k, "detail": detail,
                    **({"tags": [tag]} if tag else {})}
            result = await client.call_tool("recall_memories", args)
            assert not result.isError, result.content[0].text
            text_tokens, json_tokens = received(result)
            RATIOS.append(max(text_tokens, json_tokens) / budget)
            assert text_tokens <= budget and json_tokens <= budget, (text_tokens, json_tokens, budget)
            answer = result.structuredContent
            assert answer["total_tokens"] == text_tokens and answer["max_tokens"] == budget
            assert len(answer["memories"]) <= top_k
            if answer.get("needed_tokens"):
                # The budget it names does show the best match, still within that budget.
                assert answer["truncated"] and not answer["memories"]
                again = await client.call_tool("recall_memories", {**args, "max_tokens": answer["needed_tokens"]})
                assert again.structuredContent["memories"] and max(received(again)) <= answer["needed_tokens"]

    anyio.run(scenario)


def test_zz_report_max_ratio():
    """Runs after the property test in this module: the worst received/max_tokens it saw (-s shows it)."""
    assert RATIOS and max(RATIOS) <= 1.0
    print(f"\nbudget property test: {len(RATIOS)} answers, max received/max_tokens = {max(RATIOS):.3f}")


def test_budget_below_the_minimum_is_a_typed_error(server):
    async def scenario():
        async with create_connected_server_and_client_session(server) as client:
            result = await client.call_tool("recall_memories", {"query": "x", "max_tokens": MIN_AGENT_TOKENS - 1})
            assert result.isError and result.content[0].text.startswith("recall_budget: ")
            bad = await client.call_tool("recall_memories", {"query": "x", "detail": "everything"})
            assert bad.isError and bad.content[0].text.startswith("invalid_input: ")

    anyio.run(scenario)


def test_empty_answer_fits_the_minimum_budget():
    """The envelope that says nothing fits, with the largest numbers it can carry, fits MIN_AGENT_TOKENS."""
    huge = [{"id": 2**62, "rank": 10**6, "session_id": "s" * 200, "content": "word " * 5000, "tags": [], "metadata": {},
             "version": 1, "updated_at": "2026-01-01T00:00:00"}] * 3
    for detail in ("compact", "full"):
        page = recall_page(huge, max_tokens=MIN_AGENT_TOKENS, counter=COUNTER, limit=1000, offset=999_000, detail=detail,
                           extra={"floor": 1.0})
        assert page.needed and page.tokens <= MIN_AGENT_TOKENS


def test_fit_page_is_generic_and_exact():
    """Other listings reuse fit_page with their own renderers; frames are counted too."""
    items = [{"title": f"Result {i}", "body": "lorem ipsum " * (i % 7)} for i in range(50)]
    header = "Search results for a rather long header line that costs tokens:"
    for budget in (20, 40, 100, 400):
        page = fit_page(items, max_tokens=budget, counter=COUNTER, line=lambda r: f"* {r['title']}: {r['body']}",
                        item=lambda r: r, limit=None,
                        text_frame=lambda lines, p: "\n".join([header, *lines]),
                        structured_frame=lambda objs, p: {"results": objs, "tokens": p.text_tokens})
        assert page.text_tokens <= budget or page.needed
        assert COUNTER.count(page.text) == page.text_tokens and COUNTER.count(to_json(page.structured)) == page.structured_tokens
        if page.chosen:
            assert page.tokens <= budget and page.chosen == sorted(page.chosen)
            assert page.next_position is None or page.next_position > page.chosen[-1]


def test_rest_body_fits(hash_engine):
    hash_engine.save([{"content": f"Budget fact {i}: " + "detail " * (i * 5), "tags": ["t"], "metadata": {"i": i}} for i in range(20)])
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        for budget in (64, 150, 500):
            for detail in ("compact", "full"):
                response = httpx.post(base + "/recall_memories", json={"query": "budget fact detail", "max_tokens": budget, "detail": detail})
                assert response.status_code == 200
                assert COUNTER.count(response.content.decode()) <= budget
                assert response.json()["max_tokens"] == budget


def test_cli_output_fits(env, capsys):
    assert main(["save", *[f"CLI fact {i} " + "padding " * i for i in range(15)]]) == 0
    capsys.readouterr()
    for budget in ("64", "200"):
        for extra in ([], ["--json"], ["--detail", "full"]):
            assert main(["recall", "CLI fact padding", "--max-tokens", budget, *extra]) == 0
            out = capsys.readouterr().out
            assert COUNTER.count(out.rstrip("\n")) <= int(budget), out

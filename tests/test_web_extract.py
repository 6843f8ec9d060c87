"""Extraction quality on saved real-world-like pages (news, docs, forum, product, table): the main
text is kept as Markdown (headings, lists, tables, code), site chrome is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinycontext.budget.tokens import TokenCounter
from tinycontext.web.chunk import chunk_markdown
from tinycontext.web.extract import extract_html

FIXTURES = Path(__file__).parent / "fixtures" / "web"
PAGES = sorted(p.stem for p in FIXTURES.glob("*.html"))


def load(name: str):
    return (FIXTURES / f"{name}.html").read_text(encoding="utf-8"), json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def test_fixture_set_covers_the_page_kinds():
    assert PAGES == ["docs", "forum", "news", "product", "table"]


@pytest.mark.parametrize("name", PAGES)
def test_main_text_kept_and_boilerplate_dropped(name):
    html, spec = load(name)
    page = extract_html(html, "https://site.example/page")
    assert page.title == spec["title"]
    missing = [s for s in spec["expected"] if s not in page.markdown]
    leaked = [s for s in spec["boilerplate"] if s in page.markdown]
    assert not missing, missing
    assert not leaked, leaked
    # Expected snippets come in page order.
    positions = [page.markdown.index(s) for s in spec["expected"]]
    assert positions == sorted(positions) or name == "forum"  # the forum quotes an earlier post


def test_structure_survives_as_markdown():
    docs = extract_html(load("docs")[0], "https://site.example/docs").markdown
    assert "## The retry policy" in docs
    assert "```" in docs and "client = Client(" in docs
    assert "| `max_attempts` | 3 | Total attempts, including the first one |" in docs
    forum = extract_html(load("forum")[0], "https://site.example/t").markdown
    assert "- Discard all but 20 g of starter" in forum


def test_links_are_absolute_and_exclude_scripts_and_the_page_itself():
    html = ('<html><head><base href="https://docs.example/v2/"></head><body><article><p>' + "text " * 50 +
            '<a href="guide">Guide</a> <a href="javascript:void(0)">Click</a> <a href="#top">Top</a> '
            '<a href="mailto:a@b.c">Mail</a> <a href="https://docs.example/v2/page">Self</a> <a href="/other#x">Other</a>'
            '<a href="guide">Guide again</a></p></article></body></html>')
    links = extract_html(html, "https://docs.example/v2/page").links
    assert [(l.url, l.text) for l in links] == [("https://docs.example/v2/guide", "Guide"), ("https://docs.example/other", "Other")]
    # An answer that shows no links (a small budget) does not collect them; the text is the same.
    without = extract_html(html, "https://docs.example/v2/page", links=False)
    assert without.links == [] and without.markdown == extract_html(html, "https://docs.example/v2/page").markdown


@pytest.mark.parametrize("name", PAGES)
def test_passages_are_original_text_with_offsets_and_bounded_size(name):
    counter = TokenCounter()
    markdown = extract_html(load(name)[0], "https://site.example/").markdown
    chunks = chunk_markdown(markdown, counter, max_tokens=60, passage_tokens=100)
    assert chunks
    for chunk in chunks:
        assert markdown[chunk.start:chunk.end] == chunk.text
        assert chunk.tokens <= 60
        # Units (what ranking also scores) are pieces of the chunk, in order, not overlapping.
        assert all(chunk.start <= a < b <= chunk.end for a, b in chunk.units)
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(chunk.units, chunk.units[1:]))
    starts = [c.start for c in chunks]
    assert starts == sorted(starts)
    # Nothing but whitespace, headings (the chunks' heading paths) and table rules is left out.
    kept = "".join(c.text for c in chunks)
    headings = [line for line in markdown.splitlines() if line.startswith("#")]
    rules = [line for line in markdown.splitlines() if set(line.strip()) <= set("|-: ") and "-" in line]
    assert len("".join(kept.split())) == len("".join(markdown.split())) - sum(len("".join(l.split())) for l in headings + rules)
    for before, after in zip(chunks, chunks[1:]):  # a gap is the page's text between two chunks of a section
        assert after.gap is None or markdown[before.end:after.start] == after.gap
        assert after.gap is None or after.heading_path == before.heading_path


def test_list_items_and_table_rows_are_units_of_their_own():
    counter = TokenCounter()
    text = ("# Kit\n\n- A tent for two\n- A stove\n  that folds\n- Water filter\n\n| Item | Weight |\n|---|---|\n"
            "| Tent | 1.2 kg |\n| Stove | 0.3 kg |\n\nA closing paragraph.")
    chunks = chunk_markdown(text, counter)
    assert [c.text for c in chunks] == ["- A tent for two", "- A stove\n  that folds", "- Water filter", "| Item | Weight |",
                                        "| Tent | 1.2 kg |", "| Stove | 0.3 kg |", "A closing paragraph."]
    assert all(c.heading_path == ("Kit",) for c in chunks)
    assert chunks[0].gap is None and chunks[4].gap == "\n|---|---|\n"  # the table rule lies between its rows
    assert len({c.passage for c in chunks}) == 1  # one short section: one passage


def test_long_blocks_are_cut_at_sentences_and_headings_give_the_path():
    counter = TokenCounter()
    text = "# Top\n\nLead.\n\n## Part\n\n" + " ".join(f"Sentence number {i} says something." for i in range(60)) + "\n\n### Deeper\n\nTail."
    chunks = chunk_markdown(text, counter, max_tokens=50, passage_tokens=80)
    assert all(c.tokens <= 50 for c in chunks)
    assert chunks[0].heading_path == ("Top",) and chunks[0].text == "Lead."
    assert chunks[1].heading_path == ("Top", "Part") and chunks[1].gap is None and chunks[2].gap == " "
    assert chunks[-1].heading_path == ("Top", "Part", "Deeper") and chunks[-1].text == "Tail."
    assert all(c.text.rstrip().endswith(".") for c in chunks)
    assert len({c.passage for c in chunks[1:-1]}) > 1  # a long section is several passages
    assert chunks[-1].passage != chunks[-2].passage  # a passage never spans two sections


@pytest.mark.parametrize("text", [
    "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。" * 40,  # CJK: sentences without spaces
    "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです、" * 40,  # CJK without one sentence end
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ" * 60,  # Thai: no spaces between words
    "https://example.org/" + "a1b2" * 1500,  # one long token run
])
def test_no_passage_is_over_the_chunk_size_whatever_the_script(text):
    counter = TokenCounter()
    markdown = f"# Title\n\n{text}\n\nEnd."
    chunks = chunk_markdown(markdown, counter, max_tokens=160)
    assert len(chunks) > 2 and all(c.tokens <= 160 for c in chunks)
    assert all(markdown[c.start:c.end] == c.text for c in chunks)
    assert all(c.heading_path == ("Title",) for c in chunks)  # the heading is the chunks' path, not a chunk
    body = markdown.removeprefix("# Title\n\n")
    assert "".join(c.text for c in chunks).replace("\n", "") == body.replace("\n", "")  # nothing lost or added


def test_short_posts_next_to_action_links_are_kept():
    posts = "".join(f'<div class="msg"><p><strong>Ann</strong>: Short post number {i}.</p>'
                    f'<span class="actions"><a href="#r{i}">Reply</a> · <a href="#q{i}">Quote</a></span></div>' for i in range(30))
    html = f"<html><body><nav><a href='/'>Home</a></nav><main><h1>Thread</h1>{posts}</main></body></html>"
    markdown = extract_html(html, "https://forum.example/t/1").markdown
    assert all(f"Short post number {i}." in markdown for i in range(30))
    assert "Reply" not in markdown and "Quote" not in markdown

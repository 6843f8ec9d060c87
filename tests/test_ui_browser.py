"""The memory browser in real headless Chromium (Playwright, Debian's chromium, launched with the
product's own flags): every request stays on the server's origin, and each action works as a person
would use it: Enter searches, an edit shows in the history, deletes ask first, bulk delete counts first,
another origin cannot write, and a token-protected server asks for its token."""

from __future__ import annotations

import pytest

from netguard import LocalServer, send
from test_browser import needs_browser
from tinycontext import TinyContextConfig
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background

pytestmark = needs_browser
TOKEN = "ui-browser-token-0123456789abcdef"
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    from tinycontext.web.browser.launch import LAUNCH_ARGS, find_executable, sandboxed

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(find_executable(TinyContextConfig())), args=LAUNCH_ARGS,
                                    chromium_sandbox=sandboxed())
        yield browser
        browser.close()


def seed(engine) -> dict[str, int]:
    ids = engine.save([{"content": "The staging database is Postgres 16", "tags": ["db"]},
                       {"content": "Releases happen on Tuesdays", "tags": ["process"]}], session_id="proj")["ids"]
    chat = engine.save([{"content": "I adopted a puppy named Rex", "speaker": "Caroline"},
                        {"content": "Rex chewed my shoes", "speaker": "Melanie"}], session_id="chat")["ids"]
    return {"db": ids[0], "release": ids[1], "puppy": chat[0], "shoes": chat[1]}


class Opened:
    """A page on the UI with every request it made recorded."""

    def __init__(self, browser, base: str):
        self.base = base
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.requests: list[str] = []
        self.context.on("request", lambda request: self.requests.append(request.url))

    def open(self, fragment: str = "sessions"):
        self.page.goto(f"{self.base}/ui#{fragment}")
        return self.page

    def foreign(self) -> list[str]:
        return [url for url in self.requests if not url.startswith(self.base + "/") and not url.startswith("blob:" + self.base)]


@pytest.fixture
def ui(chromium, hash_engine):
    ids = seed(hash_engine)
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        opened = Opened(chromium, base)
        opened.ids = ids
        yield opened
        opened.context.close()


def test_every_view_loads_with_no_request_to_another_origin(ui):
    page = ui.open()
    page.get_by_role("cell", name="proj", exact=True).wait_for()
    assert "4 memories" in page.locator("#summary").inner_text()
    for view, ready in (("search", "#q"), ("browse", "#list-table td >> text=Rex chewed my shoes"),
                        (f"memory/{ui.ids['db']}", "#edit-content")):
        page.get_by_role("link", name=view.split("/")[0].title()).click() if "/" not in view else page.goto(f"{ui.base}/ui#{view}")
        page.locator(ready).first.wait_for()
    assert len(ui.requests) >= 5 and not ui.foreign(), ui.foreign()


def test_enter_in_the_search_box_runs_recall_and_shows_scores(ui):
    page = ui.open("search")
    box = page.get_by_label("Query")
    box.fill("staging database")
    box.press("Enter")
    first = page.locator("#search-table tbody tr").first
    first.get_by_text("The staging database is Postgres 16").wait_for()
    cells = first.locator("td").all_inner_texts()
    assert cells[0] == "1" and cells[1] == "yes" and float(cells[3]) > 0 and float(cells[5]) > 0
    assert "tokens as text" in page.locator("#search-cost").inner_text()
    assert not ui.foreign()


def test_an_edit_shows_in_the_history(ui, hash_engine):
    page = ui.open(f"memory/{ui.ids['db']}")
    content = page.get_by_label("Content")
    content.wait_for()
    content.fill("The staging database is Postgres 17")
    page.get_by_role("button", name="Save changes").click()
    page.get_by_text("Saved version 2.").wait_for()
    history = page.locator("#history-table tbody tr").first.locator("td").all_inner_texts()
    assert history[:2] == ["1", "The staging database is Postgres 16"]
    assert hash_engine.get(ui.ids["db"])["content"] == "The staging database is Postgres 17"


def confirm_next(page, accept: bool) -> list:
    """Answer the page's next dialog with ``accept``; the list gets its (type, message)."""
    asked: list = []
    page.once("dialog", lambda dialog: (asked.append((dialog.type, dialog.message)), dialog.accept() if accept else dialog.dismiss()))
    return asked


def wait_for_dialog(page, asked: list) -> tuple[str, str]:
    for _ in range(200):  # the dialog event reaches Python while Playwright waits, not within the click
        if asked:
            return asked[0]
        page.wait_for_timeout(25)
    pytest.fail("no dialog appeared")


def test_a_delete_asks_for_confirmation_first(ui, hash_engine):
    page = ui.open(f"memory/{ui.ids['release']}")
    page.get_by_label("Content").wait_for()
    asked = confirm_next(page, accept=False)
    page.get_by_role("button", name="Delete memory").click()
    kind, message = wait_for_dialog(page, asked)
    assert kind == "confirm" and "cannot be undone" in message
    assert hash_engine.get(ui.ids["release"])["id"] == ui.ids["release"]  # dismissed: still there
    asked = confirm_next(page, accept=True)
    page.get_by_role("button", name="Delete memory").click()
    wait_for_dialog(page, asked)
    page.get_by_text(f"Deleted memory {ui.ids['release']}.").wait_for()
    assert hash_engine.stats()["memories"] == 3


def test_bulk_delete_shows_the_dry_run_count_then_deletes_that_many(ui, hash_engine):
    page = ui.open("browse")
    page.locator("#list-table td >> text=Rex chewed my shoes").wait_for()
    page.get_by_label("Session", exact=True).select_option("chat")
    page.get_by_role("button", name="Apply filters").click()
    page.get_by_text("2 memories match; showing 1–2.").wait_for()
    page.get_by_role("button", name="Count matches (dry run)").click()
    page.get_by_text("Dry run: 2 memories match; nothing was deleted.").wait_for()
    assert hash_engine.stats()["memories"] == 4
    asked = confirm_next(page, accept=True)
    page.get_by_role("button", name="Delete 2 matching memories").click()
    assert wait_for_dialog(page, asked) == ("confirm", "Delete 2 memories and their history? This cannot be undone.")
    page.get_by_text("Deleted 2 memories.").wait_for()
    assert hash_engine.stats()["memories"] == 2


def test_export_downloads_jsonl(ui):
    page = ui.open()
    page.get_by_role("cell", name="proj", exact=True).wait_for()
    with page.expect_download() as download:
        page.get_by_role("button", name="Export session proj").click()
    lines = open(download.value.path(), encoding="utf-8").read().splitlines()
    assert '"type": "header"' in lines[0] and sum('"type": "memory"' in line for line in lines) == 2
    assert download.value.suggested_filename == "tinycontext-export-proj.jsonl"
    assert not ui.foreign()


def test_a_page_of_another_origin_cannot_write(ui, hash_engine):
    """A page on another loopback port (what a hostile local app or a rebinding site would be): its
    fetch with the UI header needs a preflight the server never grants, and a simple POST without it
    is refused; the memory is unchanged."""
    target = f"{ui.base}/ui/api/memory/{ui.ids['db']}"
    with LocalServer({"/": lambda h: send(h, 200, b"<!doctype html><title>other</title>")}) as other:
        page = ui.page
        page.goto(other.url("/"))
        preflighted = page.evaluate("""async (url) => {
            try { const r = await fetch(url, {method: 'POST', headers: {'X-TinyContext-UI': '1', 'Content-Type': 'application/json'},
                                              body: JSON.stringify({content: 'planted'})});
                  return 'answered ' + r.status; } catch (e) { return 'blocked'; } }""", target)
        simple = page.evaluate("""async (url) => {
            const r = await fetch(url, {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'},
                                        body: JSON.stringify({content: 'planted'})});
            return r.type; }""", target)
    assert preflighted == "blocked" and simple == "opaque"
    assert hash_engine.get(ui.ids["db"])["content"] == "The staging database is Postgres 16"


def test_a_token_server_asks_for_the_token(chromium, hash_engine):
    seed(hash_engine)
    with background(create_app(engine=hash_engine, settings=ServeSettings(token=TOKEN))) as base:
        opened = Opened(chromium, base)
        try:
            page = opened.open()
            token = page.get_by_label("API token")
            token.wait_for()
            assert not page.get_by_role("cell", name="proj", exact=True).is_visible()
            token.fill("wrong-" + TOKEN)
            token.press("Enter")
            page.get_by_text("Sign in with the server's API token").wait_for()
            page.get_by_label("API token").fill(TOKEN)
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("cell", name="proj", exact=True).wait_for()
            assert page.locator("#token-form").is_hidden() and not opened.foreign()
        finally:
            opened.context.close()


def test_keyboard_alone_reaches_the_views_and_the_search_controls_in_reading_order(ui):
    page = ui.open()
    page.get_by_role("cell", name="proj", exact=True).wait_for()
    focused = []
    for _ in range(3):
        page.keyboard.press("Tab")
        focused.append(page.evaluate("document.activeElement.textContent.trim()"))
    assert focused == ["Sessions", "Search", "Browse"]
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")  # follows the Search link
    from playwright.sync_api import expect

    expect(page.locator("#q")).to_be_focused()  # a locator wait: the page's CSP forbids wait_for_function's string eval
    order = []
    for _ in range(5):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id || document.activeElement.textContent.trim()"))
    assert order == ["search-session", "search-budget", "search-detail", "search-superseded", "Search"]
    # Every clickable control is a real button or link, so Enter and Space work on it.
    assert page.evaluate("[...document.querySelectorAll('[onclick], [role=button]')].length") == 0


def test_a_superseded_fact_is_marked_and_links_to_the_current_one(ui, hash_engine):
    old = hash_engine.save([{"content": "The office wifi password is apple-pie", "tags": ["office"]}], session_id="proj")["ids"][0]
    new = hash_engine.save([{"content": "The office wifi password is banana-split", "tags": ["office"], "supersedes": old}],
                           session_id="proj")["ids"][0]
    page = ui.open("browse")
    page.get_by_label("Tags (any of, comma-separated)").fill("office")
    page.get_by_label("Tags (any of, comma-separated)").press("Enter")
    page.get_by_text("2 memories match").wait_for()
    old_row = page.locator("#list-table tbody tr", has_text="apple-pie")
    assert old_row.locator(".badge").inner_text() == "superseded"
    assert page.locator("#list-table tbody tr", has_text="banana-split").locator(".badge").count() == 0
    old_row.get_by_role("link").click()
    page.get_by_role("link", name=f"memory {new}").click()
    from playwright.sync_api import expect

    expect(page.locator("#memory-title")).to_have_text(f"Memory {new}")
    page.get_by_role("link", name="Search").click()
    page.get_by_label("Query").fill("office wifi password")
    page.get_by_label("Query").press("Enter")
    page.get_by_text("1 superseded fact left out").wait_for()
    assert "apple-pie" not in page.locator("#search-table").inner_text()
    page.get_by_label("Include superseded facts").check()
    page.get_by_role("button", name="Search").click()
    page.locator("#search-table tbody tr", has_text="apple-pie").locator(".badge").wait_for()

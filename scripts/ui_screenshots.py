"""Screenshots of the memory browser for docs/ui.md: sample memories in a temporary database, the
real built-in model, the REST app on loopback and Debian's Chromium through Playwright.

    /work/coord/offline python scripts/ui_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background
from tinycontext.web.browser.launch import LAUNCH_ARGS, find_executable, sandboxed

SAMPLES = {
    "project-atlas": [
        {"content": "The staging database is Postgres 16 on db-staging.internal, port 5433.", "tags": ["infra", "db"],
         "metadata": {"source": "standup"}},
        {"content": "Releases go out on Tuesdays after the 14:00 review; hotfixes any day with two approvals.",
         "tags": ["process"]},
        {"content": "The API rate limit is 600 requests per minute per token.", "tags": ["api"]},
        {"content": "Alice owns the billing service; Bob is on call this week.", "tags": ["people"]},
        {"content": "We chose SQLite FTS5 over Elasticsearch for local search: one file, no server.", "tags": ["decision"]},
    ],
    "chat-2023-05": [
        {"content": "I adopted a puppy named Rex last weekend!", "speaker": "Caroline", "occurred_at": "2023-05-08T13:56"},
        {"content": "Rex chewed through my running shoes.", "speaker": "Caroline", "occurred_at": "2023-05-09T09:10"},
        {"content": "I'm training for the Berlin marathon in September.", "speaker": "Melanie", "occurred_at": "2023-05-09T09:12"},
    ],
    "preferences": [
        {"content": "Prefers concise answers with code first, explanation after.", "tags": ["style"]},
        {"content": "Uses Python 3.11 and uv; avoid Poetry in examples.", "tags": ["tooling"]},
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        config = TinyContextConfig(memory_db_path=Path(tmp) / "memory.db", models_dir=Path(tmp) / "models")
        with MemoryEngine(config) as engine:
            ids = {}
            for session, memories in SAMPLES.items():
                ids[session] = engine.save(memories, session_id=session)["ids"]
            first = ids["project-atlas"][0]
            engine.update(first, "The staging database is Postgres 16 on db-staging.internal, port 5432.")
            engine.update(first, tags=["infra", "db", "staging"])
            release = ids["project-atlas"][1]
            engine.save([{"content": "Releases go out on Wednesdays after the 10:00 review (from March).", "tags": ["process"],
                          "supersedes": release}], session_id="project-atlas")
            with background(create_app(engine=engine, settings=ServeSettings())) as base, sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(find_executable(config)), args=LAUNCH_ARGS,
                                            chromium_sandbox=sandboxed())
                page = browser.new_page(viewport={"width": 1366, "height": 768})

                def shot(name: str) -> None:
                    page.screenshot(path=str(args.out / f"ui-{name}.png"), full_page=True)
                    print(args.out / f"ui-{name}.png")

                page.goto(f"{base}/ui#sessions")
                page.get_by_role("cell", name="project-atlas", exact=True).wait_for()
                shot("sessions")
                page.get_by_role("link", name="Search").click()
                page.get_by_label("Query").fill("which database does staging use?")
                page.get_by_label("Agent budget (tokens)").fill("120")
                page.get_by_label("Query").press("Enter")
                page.locator("#search-table tbody tr").first.wait_for()
                page.locator("details").evaluate("d => d.open = true")
                shot("search")
                page.get_by_role("link", name="Browse").click()
                page.get_by_label("Session", exact=True).select_option("chat-2023-05")
                page.get_by_role("button", name="Apply filters").click()
                page.get_by_text("3 memories match").wait_for()
                page.get_by_role("button", name="Count matches (dry run)").click()
                page.get_by_text("Dry run: 3 memories match").wait_for()
                shot("browse")
                page.goto(f"{base}/ui#memory/{first}")
                page.locator("#history-table tbody tr").nth(1).wait_for()
                shot("memory")
                page.goto(f"{base}/ui#browse")
                page.get_by_label("Session", exact=True).select_option("project-atlas")
                page.get_by_label("Tags (any of, comma-separated)").fill("process")
                page.get_by_role("button", name="Apply filters").click()
                page.get_by_text("2 memories match").wait_for()
                shot("superseded")
                browser.close()


if __name__ == "__main__":
    main()

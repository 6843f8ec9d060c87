"""The README is a front page and docs/ holds the rest: its size, its links, and the settings reference
that is generated from TinyContextConfig (scripts/config_reference.py) and must match it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import config_reference  # noqa: E402

PAGES = ("features", "library", "conversations", "filters", "cli", "mcp", "rest", "web", "browser", "harness", "docker", "configuration", "telemetry", "management")
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_the_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    assert lines[2].startswith("```") and "evals.run dataset=scifact" in lines[3] and "pytest" in lines[4]  # the two commands first


def test_every_topic_has_a_page_and_every_link_resolves():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert (REPO / "docs" / f"{page}.md").is_file() and f"docs/{page}.md" in readme, page
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        for target, _ in LINK.findall(doc.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://")):
                assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_the_configuration_reference_matches_the_model():
    page = config_reference.PAGE.read_text(encoding="utf-8")
    assert config_reference.render(page) == page, "docs/configuration.md is stale: run python scripts/config_reference.py"
    from tinycontext import TinyContextConfig

    for name in TinyContextConfig.model_fields:
        assert f"| `{name}`<br>" in page


def test_the_reference_check_sees_a_change():
    page = config_reference.PAGE.read_text(encoding="utf-8").replace("| `recall_top_k`<br>", "| `recall_topk`<br>")
    assert config_reference.render(page) != page

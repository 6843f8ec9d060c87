"""scripts/web_evidence_paired.py: run B pooled from several run folders (one per held-out conversation), paired per
question with run A; a question in two B folders is refused; answers over their budget are counted."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from web_evidence_paired import compare, over_budget, read_runs  # noqa: E402


def write_run(folder: Path, recalls: dict[str, float], budget: int = 300, tokens: int = 280, structured: int = 290) -> Path:
    folder.mkdir()
    rows = [{"dataset": "locomo", "qid": q, "method": "whole page", "budget": None, "tokens": 9000, "recall": 1.0,
             "structured_tokens": None} for q in recalls]
    rows += [{"dataset": "locomo", "qid": q, "method": "scrape_urls", "budget": budget, "tokens": tokens, "recall": r,
              "structured_tokens": structured} for q, r in recalls.items()]
    pd.DataFrame(rows).to_csv(folder / "per_query.csv", index=False)
    return folder


def test_pooled_folds_pair_with_one_run_over_every_conversation(tmp_path):
    a = write_run(tmp_path / "int8", {"conv-41:0": 0.0, "conv-41:1": 1.0, "conv-42:0": 0.5, "conv-43:0": 1.0})
    folds = [write_run(tmp_path / "f41", {"conv-41:0": 1.0, "conv-41:1": 1.0}),
             write_run(tmp_path / "f42", {"conv-42:0": 1.0}),
             write_run(tmp_path / "f43", {"conv-43:0": 0.0})]
    [row] = compare(read_runs([a]), read_runs(folds), "scrape_urls", np.random.default_rng(0), np.random.default_rng(1))
    assert row["questions"] == 4 and row["A"] == pytest.approx(0.625) and row["B"] == pytest.approx(0.75)
    assert row["B - A"] == pytest.approx(0.125) and (row["B better"], row["B worse"]) == (2, 1)
    assert row["low"] <= row["B - A"] <= row["high"] and 0.0 <= row["B low"] <= row["B"] <= row["B high"] <= 1.0
    # B's own interval comes from its own generator: the paired interval is the same with or without it.
    [plain] = compare(read_runs([a]), read_runs(folds), "scrape_urls", np.random.default_rng(0))
    assert (plain["low"], plain["high"]) == (row["low"], row["high"]) and "B low" not in plain


def test_a_question_in_two_pooled_runs_is_refused(tmp_path):
    folds = [write_run(tmp_path / "f41", {"conv-41:0": 1.0}), write_run(tmp_path / "all", {"conv-41:0": 0.0, "conv-42:0": 1.0})]
    with pytest.raises(ValueError, match="1 questions are in more than one"):
        read_runs(folds)


def test_answers_over_budget_in_text_or_structured_content_are_counted(tmp_path):
    assert over_budget(read_runs([write_run(tmp_path / "ok", {"q0": 1.0, "q1": 0.0})]), "scrape_urls") == (2, 0)
    assert over_budget(read_runs([write_run(tmp_path / "text", {"q0": 1.0}, tokens=301)]), "scrape_urls") == (1, 1)
    assert over_budget(read_runs([write_run(tmp_path / "json", {"q0": 1.0}, structured=301)]), "scrape_urls") == (1, 1)

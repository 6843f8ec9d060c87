"""The learned fusion's fit (scripts/locomo_fusion.py): what the unit of its listwise loss changes. Synthetic features."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import locomo_fusion as lf  # noqa: E402


def _questions():
    """Half the questions have one evidence turn that feature 0 marks (their other candidates feature 1 marks); the
    other half, lists, have five evidence turns that feature 1 marks (their other candidates feature 0 marks)."""
    rng = np.random.default_rng(0)
    features, targets = [], []
    for _ in range(20):
        one = np.r_[[[1.0, 0.0]], np.tile([0.0, 1.0], (9, 1))]
        features.append(one + rng.normal(0, 0.3, one.shape))
        targets.append(np.r_[True, [False] * 9])
        many = np.r_[np.tile([0.0, 1.0], (5, 1)), np.tile([1.0, 0.0], (5, 1))]
        features.append(many + rng.normal(0, 0.3, many.shape))
        targets.append(np.r_[[True] * 5, [False] * 5])
    return features, targets


def test_weighing_each_evidence_turn_favours_what_finds_the_lists():
    features, targets = _questions()
    per_question = lf.fit(features, targets, 1e-3)
    assert np.array_equal(per_question, lf.fit(features, targets, 1e-3, "question"))  # the default, as shipped
    per_evidence = lf.fit(features, targets, 1e-3, "evidence")
    assert np.all(np.isfinite(per_evidence))
    # a list's five turns outweigh a single answer: the feature that marks the lists gains on the other
    assert per_evidence[1] - per_evidence[0] > per_question[1] - per_question[0] + 0.5

    def listed(weights):  # the lists' evidence among their top five
        return np.mean([targets[q][np.argsort(-(features[q] @ weights), kind="stable")[:5]].mean() for q in range(1, 40, 2)])

    assert listed(per_evidence) >= listed(per_question)
    with pytest.raises(ValueError, match="weigh"):
        lf.fit(features, targets, 1e-3, "turn")

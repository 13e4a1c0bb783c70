"""Calibration's judging: hits the labels do not cover are counted apart."""

from __future__ import annotations

import pytest

from bench.calibrate import Pair, calibrate
from cache import SemanticCache
from tests.cache.fixtures import Run

PAIRS = [
    Pair("How do I reset my password?", "how do I reset my password", 1),
    # The query of this near-miss finds the password question, which no pair relates
    # it to: served, it is an unjudged hit.
    Pair("What is the boiling point of water?", "How can I reset my password?", 0),
]


def test_unjudged_hits_are_left_out_of_precision_and_counted_wrong_beside_it(
    cache: SemanticCache, run: Run
):
    report = run(calibrate(cache, PAIRS), timeout=120)
    scored = report.with_guard
    assert (scored.hits, scored.false_hits, scored.unjudged_hits) == (2, 0, 1)
    assert scored.precision == 1.0
    assert scored.precision_all_hits == pytest.approx(0.5)
    assert report.answerable == 1 and scored.recall == 1.0

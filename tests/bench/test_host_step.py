"""`semgate bench host-step`: each checkout measured in a process of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.host_step import run_host_step_bench

pytestmark = pytest.mark.slow  # both checkouts measured, each in processes of its own

REPO = Path(__file__).resolve().parents[2]


def test_a_baseline_checkout_is_measured_alternating_and_compared(tmp_path):
    """This checkout as its own baseline: both sides measured in their own processes,
    each median a real positive time, their ratio reported and written."""
    out = tmp_path / "host-step.json"
    report = run_host_step_bench(quick=True, out_path=out, baseline=REPO)
    assert json.loads(out.read_text()) == report
    [ours], [theirs] = report["runs"]["this checkout"], report["runs"]["baseline"]
    for run in (ours, theirs):
        assert run["streams"] == 64 and run["tokens"] == 16 and run["steps"] == 15
        assert 0 < run["median_ms"] < 1000
    assert report["median_ratio"] == ours["median_ms"] / theirs["median_ms"]

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


def test_async_scheduling_is_measured_on_this_checkout_only(tmp_path):
    """--async-scheduling: this checkout steps with a step in flight (the stepping
    thread's time), the baseline as it is."""
    report = run_host_step_bench(quick=True, out_path=None, baseline=REPO, async_scheduling=True)
    [ours], [theirs] = report["runs"]["this checkout"], report["runs"]["baseline"]
    assert ours["async_scheduling"] and not theirs["async_scheduling"]
    assert ours["steps"] == theirs["steps"] == 15 and 0 < ours["median_ms"] < 1000

"""`semgate cache calibrate` and `fit-overlap` end to end: real embedded Redis, real
embedder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SEMGATE = [sys.executable, "-m", "cli.main"]
DATA = Path(__file__).parents[2] / "data"
ENV = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {"HF_HUB_OFFLINE": "1"}


def semgate_cache(
    *args: str, timeout: float, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`semgate cache ARGS` in a child process, its output captured as text."""
    return subprocess.run(
        [*SEMGATE, "cache", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        check=check,
    )


def test_calibrate_prints_a_json_report(tmp_path: Path):
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"cached": "How do I reset my password?", "query": "reset password steps", "label": 1},
        {"cached": "What is 17 times 23?", "query": "What is 17 times 24?", "label": 0},
        {
            "cached": "Convert 100 °F to Celsius",
            "query": "Convert 100 °C to Fahrenheit",
            "label": 0,
        },
    ]
    pairs.write_text("\n".join(json.dumps(r) for r in rows))
    out = semgate_cache("calibrate", "--pairs", str(pairs), "--json", timeout=120, check=True)
    report = json.loads(out.stdout)
    assert report["pairs"] == 3 and report["answerable"] == 1
    assert report["with_guard"]["false_hits"] == 0
    assert report["without_guard"]["false_hits"] >= 1
    assert len(report["curve_with_guard"]) == 21


def test_calibrate_rejects_a_bad_file_readably(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"cached": "a", "query": "b"}\n')
    out = semgate_cache("calibrate", "--pairs", str(bad), timeout=60)
    assert out.returncode == 2
    assert "bad.jsonl:1" in out.stderr and "label" in out.stderr
    missing = semgate_cache("calibrate", "--pairs", str(tmp_path / "no"), timeout=60)
    assert missing.returncode == 2 and "cannot read pairs file" in missing.stderr


def test_fit_overlap_prints_the_bar_and_each_file_held_out():
    files = [str(DATA / "cache_pairs.jsonl"), str(DATA / "cache_pairs_holdout.jsonl")]
    out = semgate_cache("fit-overlap", "--pairs", *files, "--json", timeout=300, check=True)
    report = json.loads(out.stdout)
    bar = report["bar"]
    assert bar["ceiling"] == 0.92 and bar["per_sequence"] > 0
    assert [s["name"] for s in report["held_out"]] == files
    for score in report["held_out"]:
        assert score["with_bar"]["false_hits"] <= score["without_bar"]["false_hits"]


def test_fit_overlap_refuses_an_impossible_target_before_measuring():
    pairs = str(DATA / "cache_pairs.jsonl")
    out = semgate_cache("fit-overlap", "--pairs", pairs, "--target-precision", "1.5", timeout=60)
    assert out.returncode == 2 and "--target-precision: 1.5 must be in (0, 1]" in out.stderr

"""`semgate cache calibrate` end to end: real embedded Redis, real embedder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SEMGATE = [sys.executable, "-m", "gateway.cli"]
ENV = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {"HF_HUB_OFFLINE": "1"}


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
    out = subprocess.run(
        [*SEMGATE, "cache", "calibrate", "--pairs", str(pairs), "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["pairs"] == 3 and report["answerable"] == 1
    assert report["with_guard"]["false_hits"] == 0
    assert report["without_guard"]["false_hits"] >= 1
    assert len(report["curve_with_guard"]) == 21


def test_calibrate_rejects_a_bad_file_readably(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"cached": "a", "query": "b"}\n')
    out = subprocess.run(
        [*SEMGATE, "cache", "calibrate", "--pairs", str(bad)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert out.returncode == 2
    assert "bad.jsonl:1" in out.stderr and "label" in out.stderr
    missing = subprocess.run(
        [*SEMGATE, "cache", "calibrate", "--pairs", str(tmp_path / "no")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert missing.returncode == 2 and "cannot read pairs file" in missing.stderr

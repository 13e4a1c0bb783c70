"""`semgate cache calibrate` and `fit` end to end: real embedded Redis, real
embedder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each command loads the embedder in a process of its own

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


def test_fit_prints_both_models_and_each_file_held_out(tmp_path: Path):
    english = [str(DATA / "cache_pairs.jsonl"), str(DATA / "cache_pairs_holdout.jsonl")]
    other = [str(DATA / "cache_multilingual_a.jsonl"), str(DATA / "cache_multilingual_c.jsonl")]
    written = tmp_path / "verifier.json"
    out = semgate_cache(
        "fit", "--pairs", *english, "--multilingual", *other, "--score", english[0],
        "--write", str(written), "--json", timeout=600, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    models = report["verifiers"]
    assert models["english"]["features"][0] == "similarity"
    assert models["english"]["weights"][0] > 0  # similarity raises the odds
    assert set(models["multilingual"]["thresholds"]) >= {"fr", "es", "de", "zh", "ja", "ru"}
    scored = [(name, how) for name, how, _ in report["scores"]]
    held = [Path(f).stem for f in english + other]
    assert scored == [*((n, "held out") for n in held), ("cache_pairs", "english"),
                      ("cache_pairs", "multilingual")]  # fmt: skip
    for _, _, score in report["scores"][:2]:
        assert score["precision"] >= 0.9 and score["recall"] >= 0.5, score
    fitted = json.loads(written.read_text())
    assert fitted["tiers"]["english"] == models["english"]
    assert fitted["fitted_on"]["english"] == english


def test_fit_refuses_a_bad_file_readably(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"cached": "a", "query": "b"}\n')
    pairs = str(DATA / "cache_pairs.jsonl")
    out = semgate_cache("fit", "--pairs", pairs, "--multilingual", str(bad), timeout=60)
    assert out.returncode == 2 and "bad.jsonl:1" in out.stderr

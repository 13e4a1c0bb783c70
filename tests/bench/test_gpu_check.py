"""bench/gpu_check.py's repeated timing of the graphs mode, run on a CPU (flash_reference,
the padded graph steps run eagerly): what scripts/gpu-check --graph-rounds runs on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two runs of the benchmark in processes of their own

REPO = Path(__file__).resolve().parents[2]


def test_graph_rounds_time_each_round_on_a_random_model(tmp_path: Path):
    tokenizer = tmp_path / "tok"
    module = [sys.executable, "-m", "bench.gpu_check"]
    subprocess.run([*module, "--export-tokenizer", str(tokenizer)], cwd=REPO, check=True)
    out = tmp_path / "rounds.json"
    subprocess.run(
        [*module, "--device", "cpu", "--quick", "--graph-rounds", "2",
         "--mode", "engine_flash_graphs_async",
         "--tokenizer-dir", str(tokenizer), "--out", str(out)],
        cwd=REPO, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and "error" not in result
    rounds = result["graph_rounds"]
    assert rounds["mode"] == "engine_flash_graphs_async"
    assert rounds["requests"] == 8 and rounds["request_tokens"] == 16
    assert len(rounds["batch_tok_s"]) == len(rounds["batch1_tok_s"]) == 2
    assert all(rate > 0 for rate in rounds["batch_tok_s"] + rounds["batch1_tok_s"])
    assert rounds["median_after_first"] == {
        "batch": rounds["batch_tok_s"][1],
        "batch1": rounds["batch1_tok_s"][1],
    }

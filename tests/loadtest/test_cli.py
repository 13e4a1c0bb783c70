"""`semgate loadtest run` end to end: the report files it writes."""

from __future__ import annotations

import json
from pathlib import Path

from cli.main import main
from tests.gateway.fixtures import LOADTEST
from tests.gateway.servers import Server

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_run_writes_results_report_and_plots(gateway: Server, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["loadtest", "run", "--url", gateway.url + "/v1", "--api-key", LOADTEST]
    args += ["--workload", "mixed"]
    args += ["--num-requests", "3", "--concurrency", "3", "--long-fraction", "0.34"]
    args += ["--rag-tokens", "1024", "1100", "--max-output-tokens", "8", "--seed", "3"]
    assert main([*args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    records = results["requests"]["mixed"]
    assert len(records) == 3 and all(r["error"] is None for r in records)
    assert all(r["timings"] and "prefill" in r["timings"] for r in records)
    summary = results["summary"]["mixed"]
    assert summary["completed"] == 3
    assert summary["long_requests"] == sum(r["long"] for r in records)
    assert results["meta"]["endpoint"]["url"] == gateway.url + "/v1/chat/completions"
    report = (out / "report.md").read_text()
    assert "| TTFT p50 / p90 / p99 (ms) |" in report
    assert f"Diagnosis: {summary['phases']['diagnosis']}." in report
    for name in ("latency_cdf.png", "itl_over_time.png", "throughput.png", "ttft_split.png"):
        assert f"]({name})" in report
        assert (out / name).read_bytes().startswith(PNG_MAGIC)


def test_a_scenario_with_more_rounds_than_requests_is_refused_readably(capsys) -> None:
    args = ["loadtest", "scenario", "cache", "--num-requests", "2", "--rounds", "3"]
    assert main(args) == 2
    assert "--rounds must be between 1 and the 2 requests" in capsys.readouterr().err

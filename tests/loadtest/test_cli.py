"""`semgate loadtest run` end to end: the report files it writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli.main import main
from tests.gateway.fixtures import LOADTEST
from tests.gateway.servers import MODEL, Server

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
    meta = results["meta"]
    assert meta["endpoint"]["url"] == gateway.url + "/v1/chat/completions"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["date"])
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", meta["commit"])  # the tests run in a checkout
    assert MODEL in meta["settings"]["models listed by the server"].split(", ")
    assert meta["shape"]["concurrency"] == 3 and meta["options"]["max_output_tokens"] == 8
    report = (out / "report.md").read_text()
    assert f"- date: {meta['date']}; commit: `{meta['commit']}`" in report
    assert f"- endpoint: `{gateway.url}/v1/chat/completions`" in report
    assert "| TTFT p50 / p90 / p99 (ms) |" in report
    assert f"Diagnosis: {summary['phases']['diagnosis']}." in report
    for name in ("latency_cdf.png", "itl_over_time.png", "throughput.png", "ttft_split.png"):
        assert f"]({name})" in report
        assert (out / name).read_bytes().startswith(PNG_MAGIC)


def test_a_scenario_with_more_rounds_than_requests_is_refused_readably(capsys) -> None:
    args = ["loadtest", "scenario", "cache", "--num-requests", "2", "--rounds", "3"]
    assert main(args) == 2
    assert "--rounds must be between 1 and the 2 requests" in capsys.readouterr().err

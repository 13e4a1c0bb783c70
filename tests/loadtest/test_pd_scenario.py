"""The pd scenario's parts that need no servers: a sweep judged rate by rate and compared by
goodput, the report written and judged again from its results.json, and how the sides'
gateways, engine servers and KV stores are started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from loadtest.pd_scenario import PD_SIDES, Engine, SweepRun
from loadtest.server_stats import counters_between
from loadtest.slo import Slo
from loadtest.sweep import SweepResult, rate_slices
from loadtest.sweep_report import judge, load_result, write_sweep_report
from loadtest.work_item import WorkItem, WorkloadOptions
from tests.loadtest.records import SLO, record

MODEL = "smollm2-135m-instruct"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sweep(tmp: dict[str, dict[float, int]]) -> SweepResult:
    """Two sides at 0.1-0.4 req/s, ten requests a rate, `tmp[side][rate]` of them with a
    chat stream stalled by prefill chunks (mean gap 100 ms), the rest meeting both SLOs."""
    records = {
        side: {
            rate: [
                record(0.5, [0.1 if i < stalled else 0.02] * 20, long=i % 4 == 0) for i in range(10)
            ]
            for rate, stalled in by_rate.items()
        }
        for side, by_rate in tmp.items()
    }
    elapsed = {side: dict.fromkeys(by_rate, 50.0) for side, by_rate in tmp.items()}
    servers = {
        "P/D": {"DECODE1": {'semgate_kv_transfer_tokens_total{direction="loaded"}': 12000.0}}
    }
    settings = {side: f"semgate serve ({side})" for side in tmp}
    options = WorkloadOptions(10, max_output_tokens=64)
    return SweepResult(
        settings,
        options,
        (0.1, 0.2, 0.3, 0.4),
        0,
        records,
        elapsed,
        servers,
        "2026-11-28T07:00:00Z",
        "abc1234",
    )


SWEEP = {"P/D": {0.1: 0, 0.2: 0, 0.3: 1, 0.4: 3}, "colocated": {0.1: 0, 0.2: 2, 0.3: 4, 0.4: 6}}


def test_the_sweep_is_judged_per_rate_and_compared_by_goodput() -> None:
    summary = judge(_sweep(SWEEP), SLO)
    pd, colocated = summary["sides"]["P/D"], summary["sides"]["colocated"]
    assert [r["attainment"] for r in pd["rates"]] == [1.0, 1.0, 0.9, 0.7]
    assert [r["itl_attainment"] for r in colocated["rates"]] == [1.0, 0.8, 0.6, 0.4]
    assert colocated["rates"][1]["ttft_attainment"] == 1.0  # limited by ITL alone
    assert pd["rates"][3]["request_itl"]["p90_ms"] == pytest.approx(100.0)
    assert pd["rates"][0]["request_throughput"] == pytest.approx(0.2)
    # P/D: 0.3 met (exactly 90%), crossing at 0.3; colocated: 0.1, crossing 0.1 + 0.1 * 0.1 / 0.2
    assert pd["goodput"]["rate"] == 0.3 and pd["goodput"]["crossing"] == pytest.approx(0.3)
    assert colocated["goodput"]["crossing"] == pytest.approx(0.15)
    headline = summary["headline"]
    assert headline["ratio"] == pytest.approx(2.0) and headline["met"] is True
    assert headline["text"].endswith(": 2.00x colocated's with P/D (goal: at least 1.3x; met).")


def test_the_report_is_written_and_judged_again_from_its_results(tmp_path: Path) -> None:
    report, summary = write_sweep_report(tmp_path / "first", _sweep(SWEEP), SLO, "About.")
    text = report.read_text()
    assert "- SLOs per request: TTFT <= 1000 ms and mean ITL <= 60 ms;" in text
    assert (
        "| 0.2 | colocated | 10 / 10 | 80% / 100% / 80% | 67% / 86% | 500 / 500 | 20 / 100 |"
        in text
    )
    assert '| DECODE1 | `semgate_kv_transfer_tokens_total{direction="loaded"}` | 12,000 |' in text
    assert (tmp_path / "first" / "attainment.png").read_bytes().startswith(PNG_MAGIC)
    again, about = load_result(tmp_path / "first" / "results.json")
    assert about == "About." and again.records["P/D"][0.4][0].itl == [0.1] * 20
    assert judge(again, SLO) == json.loads(json.dumps(summary))
    looser = judge(again, Slo(1000, 120))
    assert all(r["attainment"] == 1.0 for side in looser["sides"].values() for r in side["rates"])
    assert looser["headline"]["lower_bound"] and looser["headline"]["ratio"] == 1.0
    # The same through the command line: --results judges without servers.
    out = tmp_path / "again"
    args = ["loadtest", "scenario", "pd", "--results", str(tmp_path / "first" / "results.json")]
    assert main([*args, "--slo-itl-ms", "120", "--out", str(out)]) == 0
    assert "at least 1.00x colocated's with P/D" in (out / "report.md").read_text()


def test_the_sides_servers_and_stores() -> None:
    run = SweepRun(num_threads=2)
    pd, colocated = PD_SIDES
    gateway = run.gateway_args(pd, ["http://p", "http://d"])
    assert gateway[:5] == [
        "--no-cache",
        "--upstream",
        f"{MODEL}=http://d",
        "--upstream-prefill",
        f"{MODEL}=http://p",
    ]
    assert gateway[gateway.index("--pd-min-prompt-tokens") + 1] == "1024"
    prefill, decode = (run.engine_args(engine, "redis://127.0.0.1:7000/0") for engine in pd.engines)
    assert prefill == [
        "--no-cache",
        "--num-threads",
        "2",
        "--kv-role",
        "prefill",
        "--kv-store",
        "redis://127.0.0.1:7000/0",
    ]
    assert decode[3:5] == ["--kv-role", "decode"]
    assert pd.kv_store and not colocated.kv_store
    assert run.gateway_args(colocated, ["http://a", "http://b"])[:3] == [
        "--no-cache",
        "--upstream",
        f"{MODEL}=http://a,http://b",
    ]
    assert run.engine_args(colocated.engines[0], None) == ["--no-cache", "--num-threads", "2"]
    with pytest.raises(ValueError, match="needs the side's Redis"):
        run.engine_args(Engine("decode", kv_store=True), None)
    assert pd.names() == ["PREFILL1", "DECODE1"] and colocated.names() == ["ENGINE1", "ENGINE2"]
    assert run.command(pd).split("`; `")[1:] == [
        "PREFILL1: semgate serve --no-cache --num-threads 2 --kv-role prefill --kv-store redis://STORE/0",
        "DECODE1: semgate serve --no-cache --num-threads 2 --kv-role decode --kv-store redis://STORE/0",
    ]
    with pytest.raises(ValueError, match="rates must be distinct and positive"):
        SweepRun(rates=(0.1, 0.1))


def test_each_rate_sends_requests_of_its_own() -> None:
    items = [
        WorkItem([{"role": "user", "content": str(i)}], 8, True, "sharegpt") for i in range(12)
    ]
    slices = rate_slices(items, 4)
    assert [len(s) for s in slices] == [3, 3, 3, 3]
    assert [item for s in slices for item in s] == items


def test_counter_gains_over_the_sweep() -> None:
    before = {"a_total": 5.0, "b_total": 1.0}
    after = {"a_total": 9.0, "b_total": 1.0, "c_total": 2.0}
    assert counters_between(before, after) == {"a_total": 4.0, "c_total": 2.0}


def test_flags_of_the_other_scenarios_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "scenario", "pd", "--rate", "1", "--rounds", "3"]) == 2
    assert "scenario pd sweeps --rates" in capsys.readouterr().err.replace("\n", " ")
    assert main(["loadtest", "scenario", "cache", "--rates", "0.1", "0.2"]) == 2
    assert "--rates do not apply" in capsys.readouterr().err.replace("\n", " ")
    assert main(["loadtest", "scenario", "cache", "--kill-store-after", "30"]) == 2
    assert "--kill-store-after do not apply" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(ValueError, match="kill_store_after"):
        SweepRun(kill_store_after=-1)

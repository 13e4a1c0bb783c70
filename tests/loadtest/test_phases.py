"""'Where the time goes' on hand-built records: the TTFT split, the groups around a
percentile, the slow gaps during another request's prefill, the diagnosis and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.server_timing import parse
from loadtest.meta import RunInfo
from loadtest.phases import (
    diagnose,
    percentile_group,
    prefill_interval,
    stalls_during_prefill,
    ttft_parts,
    ttft_shares,
    where_the_time_goes,
)
from loadtest.record import RequestRecord
from loadtest.report import markdown_report, write_run_report
from loadtest.summary import summarize


def _record(
    index: int,
    ttft: float,
    timings: dict[str, float] | None,
    itl: list[float] | None = None,
    sent_at: float = 0.0,
) -> RequestRecord:
    gaps = itl or []
    return RequestRecord(
        index, "sharegpt", False, 8, True, sent_at=sent_at, ttft=ttft, itl=gaps,
        e2e=ttft + sum(gaps), completion_tokens=len(gaps) + 1, timings=timings,
    )  # fmt: skip


def test_server_timing_header_as_the_load_generator_reads_it() -> None:
    value = 'cache;dur=3.1, embed;desc="a, b;c";dur=1.2, queue;dur=12, miss, bad;dur=x'
    assert parse(value) == {"cache": 3.1, "embed": 1.2, "queue": 12.0}
    assert parse("miss") == {} and parse("") == {}


def test_ttft_split_into_queue_prefills_cache_and_other() -> None:
    record = _record(0, 1.0, {"cache": 100, "embed": 40, "queue": 500, "prefill": 200})
    parts = ttft_parts(record)
    assert parts == pytest.approx(
        {"queue": 0.5, "pd-prefill": 0, "prefill": 0.2, "cache": 0.1, "other": 0.2}
    )
    # Prefilled on a prefill server (gateway/upstream/disaggregation.py), then decoded.
    apart = _record(3, 1.0, {"pd-prefill": 600, "queue": 100, "prefill": 50})
    assert ttft_parts(apart) == pytest.approx(
        {"queue": 0.1, "pd-prefill": 0.6, "prefill": 0.05, "cache": 0, "other": 0.25}
    )
    # Phases that overlap (an engine started early) add up past TTFT: no negative other.
    early = _record(1, 0.5, {"cache": 100, "queue": 300, "prefill": 300})
    assert ttft_parts(early)["other"] == 0
    shares = ttft_shares([early])
    assert shares == pytest.approx(
        {"queue": 3 / 7, "pd-prefill": 0, "prefill": 3 / 7, "cache": 1 / 7, "other": 0}
    )
    both = ttft_shares([record, early])
    assert sum(both.values()) == pytest.approx(1.0)
    assert both["queue"] == pytest.approx(0.8 / 1.7)  # summed seconds, not mean shares
    hit = _record(2, 0.05, {"cache": 20, "embed": 10})
    assert ttft_shares([hit]) == pytest.approx(
        {"queue": 0, "pd-prefill": 0, "prefill": 0, "cache": 0.4, "other": 0.6}
    )


def test_percentile_groups() -> None:
    records = [_record(i, (i + 1) / 100, {"queue": 1}) for i in range(100)]
    assert [r.index for r in percentile_group(records, 99.0)] == [99]  # p99 is 990.1 ms
    middle = percentile_group(records, 50.0)  # p45 to p55: 455.5 to 554.5 ms
    assert [r.index for r in middle] == list(range(45, 55))
    assert [r.index for r in percentile_group(records[:1], 50.0)] == [0]


def test_stalls_coincide_with_another_requests_prefill() -> None:
    # The long prompt is prefilled from 0.2 s to its first token at 1.0 s. The chat stream's
    # first stall (0.2 to 0.8 s) falls in it, its second (1.8 to 2.4 s) does not; gaps of
    # 0.15 s (3x the median 0.05 s) are slow but no stalls.
    long = _record(0, 1.0, {"queue": 10, "prefill": 800})
    gaps = [0.05, 0.05, 0.6, *[0.05] * 20, 0.15, 0.6]
    chat = _record(1, 0.1, {"prefill": 20}, itl=gaps)
    assert prefill_interval(long) == pytest.approx((0.2, 1.0))
    assert prefill_interval(_record(2, 0.1, {"cache": 3})) is None
    stalls = stalls_during_prefill([long, chat])
    assert stalls["median_gap_ms"] == pytest.approx(50.0)
    assert stalls["threshold_ms"] == pytest.approx(200.0)  # STALL_FACTOR 4
    assert (stalls["gaps"], stalls["stalls"], stalls["during_prefill"]) == (25, 2, 1)
    assert stalls["median_stall_ms"] == pytest.approx(600.0)
    assert stalls["time_share"] == pytest.approx(1.1 / 2.45)  # 2 x 0.55 s over 2.45 s
    # A stream's own prefill never counts: it ends where the stream's gaps begin.
    assert stalls_during_prefill([chat])["during_prefill"] == 0


def _phases(
    queue: float,
    cache: float,
    stall_share: float | None,
    decode: float | None,
    *,
    stalls: int = 10,
    lost: float = 0.3,
    prefill: float | None = 0.1,
    hits: int = 0,
) -> Any:
    """Phases with `stalls` stalls in 1,000 gaps adding `lost` to the time between tokens,
    `stall_share` of them (None: no stalls) during another request's prefill."""
    shares = {"queue": queue, "prefill": 0.0, "cache": cache, "other": 1 - queue - cache}
    n = 0 if stall_share is None else stalls
    return {
        "timed_requests": 20,
        "ttft": {"p99": {"shares": shares}},
        "stalls": {
            "gaps": 1000,
            "median_gap_ms": 50.0,
            "threshold_ms": 200.0,
            "stalls": n,
            "during_prefill": round(n * (stall_share or 0)),
            "median_stall_ms": 2000.0 if n else None,
            "time_share": lost if n else 0.0,
        },
        "prefill_share_of_e2e": prefill,
        "decode_share_of_e2e": decode,
        "cache_hits": hits,
    }


def test_diagnosis_rules_in_order() -> None:
    assert diagnose(_phases(0.71, 0.0, 0.9, 0.9)) == (
        "p99 TTFT is 71% queueing: add capacity or lower max_num_seqs"
    )
    remote = _phases(0.1, 0.0, 0.6, 0.9)
    remote["ttft"]["p99"]["shares"].update({"pd-prefill": 0.6, "other": 0.3})
    assert diagnose(remote).startswith("p99 TTFT is 60% remote prefill: add prefill servers")
    assert "enable chunked prefill" in diagnose(_phases(0.3, 0.5, 0.6, 0.9))
    assert "cache lookup" in diagnose(_phases(0.3, 0.5, 0.4, 0.9))
    assert diagnose(_phases(0.3, 0.1, 0.2, 0.3, prefill=0.6)).startswith("prefill-bound (60%")
    assert diagnose(_phases(0.3, 0.1, None, 0.9)).startswith("decode-bound (90% of e2e")
    assert diagnose(_phases(0.3, 0.1, 0.2, 0.3)).startswith("no single phase dominates")


def test_stalls_need_to_cost_time_and_to_coincide_with_prefills() -> None:
    """Chunked prefill at work: stalls are short or rare; the streams wait on decode."""
    assert diagnose(_phases(0.3, 0.1, 0.9, 0.8)) == (
        "ITL spikes coincide with long prefills (9 of 10 stalls, median 2,000 ms, 30% of "
        "the time between tokens): enable chunked prefill or lower max_num_batched_tokens"
    )
    assert diagnose(_phases(0.3, 0.1, 0.9, 0.8, lost=0.15)).startswith("decode-bound")
    assert diagnose(_phases(0.3, 0.1, 0.5, 0.8)).startswith("decode-bound")


def test_prefill_bound_only_when_prefill_outweighs_decode() -> None:
    assert diagnose(_phases(0.1, 0.0, None, 0.45, prefill=0.5)).startswith("prefill-bound")
    assert diagnose(_phases(0.1, 0.0, None, 0.55, prefill=0.45)).startswith("decode-bound")
    assert diagnose(_phases(0.1, 0.0, None, 0.2, prefill=0.35)).startswith("no single phase")


def test_hits_prefix_the_diagnosis_of_the_misses() -> None:
    assert diagnose(_phases(0.1, 0.0, None, 0.8, hits=15)) == (
        "75% answered from the cache; the rest: decode-bound (80% of e2e is decode): "
        "speculative decoding or quantization"
    )


def test_report_section_and_chart(tmp_path: Path, run_info: RunInfo) -> None:
    timed = [
        _record(i, 0.2 + i / 100, {"queue": 100, "prefill": 50, "decode": 300}, [0.05] * 6, i)
        for i in range(20)
    ]
    summary = summarize(timed, 25.0)
    phases = summary["phases"]
    assert phases is not None and phases["timed_requests"] == 20
    for group in phases["ttft"].values():
        assert sum(group["shares"].values()) == pytest.approx(1.0)
    report = write_run_report(tmp_path, "t", "intro", {"run": timed}, {"run": summary}, run_info)
    text = report.read_text()
    assert "## Where the time goes" in text and f"Diagnosis: {phases['diagnosis']}." in text
    assert "| p99 | 1 |" in text
    assert (tmp_path / "ttft_split.png").stat().st_size > 0


def test_a_server_without_phases(tmp_path: Path, run_info: RunInfo) -> None:
    plain = [_record(i, 0.1, None, [0.05] * 3) for i in range(5)]
    assert where_the_time_goes(plain) is None
    summary = summarize(plain, 1.0)
    text = markdown_report("t", "intro", {"vllm": summary}, [], run_info)
    assert "**vllm**: the server reports no phases" in text
    write_run_report(tmp_path, "t", "intro", {"vllm": plain}, {"vllm": summary}, run_info)
    assert not (tmp_path / "ttft_split.png").exists()

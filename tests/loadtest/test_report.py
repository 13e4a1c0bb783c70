"""The report as an SRE reads it, on hand-built records: hits and misses apart, percentile
markers, the offered load, the header (date, commit, settings) and the truncation warning."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from loadtest.meta import RunInfo, git_commit
from loadtest.plots import cdfs, latency_cdfs, throughput_over_time
from loadtest.record import RequestRecord
from loadtest.report import (
    markdown_report,
    print_table,
    table_rows,
    truncation_warnings,
    write_run_report,
)
from loadtest.runner import LoadShape
from loadtest.summary import summarize
from loadtest.work_item import WorkloadOptions

WARNING = (
    "16 of 20 misses ended at the output limit (max_tokens=32): truncated answers are never "
    "stored in the cache, so this run cannot measure hits; raise --max-output-tokens."
)


def _record(
    index: int, status: str | None, ttft: float, finish: str = "stop", gaps: int = 3
) -> RequestRecord:
    """A hit is replayed in one chunk (no gaps), as a semgate gateway does."""
    itl = [] if status == "Hit" else [0.05] * gaps
    return RequestRecord(
        index, "repeat", False, 32, False, sent_at=index * 0.5, cache_status=status, ttft=ttft,
        itl=itl, e2e=ttft + sum(itl), completion_tokens=len(itl) + 1, finish_reason=finish,
    )  # fmt: skip


def _cache_run(misses_cut: int = 0) -> list[RequestRecord]:
    """20 misses (TTFT 100..290 ms, the first `misses_cut` ended at the limit), 10 hits
    (TTFT 10..19 ms) and one Bypass."""
    misses = [
        _record(i, "Miss", 0.1 + i / 100, "length" if i < misses_cut else "stop") for i in range(20)
    ]
    hits = [_record(20 + i, "Hit", 0.01 + i / 1000) for i in range(10)]
    return [*misses, *hits, _record(30, "Bypass", 5.0)]


def test_summary_splits_hits_and_misses() -> None:
    summary = summarize(_cache_run(misses_cut=16), elapsed=20.0)
    hits, misses = summary["hits"], summary["misses"]
    assert (hits["requests"], misses["requests"]) == (10, 20)  # the Bypass in neither
    assert hits["ttft"]["p50_ms"] == pytest.approx(14.5)
    assert hits["e2e"]["p99_ms"] == pytest.approx(18.91)
    assert hits["itl"]["n"] == 0
    assert misses["ttft"]["p50_ms"] == pytest.approx(195.0)
    assert misses["ttft"]["p90_ms"] == pytest.approx(271.0)
    assert misses["e2e"]["p50_ms"] == pytest.approx(345.0)  # plus 3 gaps of 50 ms
    assert misses["itl"]["n"] == 60
    assert (misses["at_output_limit"], misses["max_tokens"]) == (16, 32)
    assert summary["ttft"]["n"] == 31  # the overall rows still take every request


def test_table_rows_show_hits_and_misses_only_where_a_run_had_hits() -> None:
    on = summarize(_cache_run(), 20.0)
    off = summarize([_record(i, "Bypass", 0.1 + i / 100) for i in range(5)], 5.0)
    rows = dict(table_rows({"cache on": on, "cache off": off}))
    assert rows["hits / misses"] == ["10 / 20", "0 / 0"]
    assert rows["hits: TTFT p50 / p90 / p99 (ms)"][0] == "14.5 / 18.1 / 18.9"
    assert rows["misses: TTFT p50 / p90 / p99 (ms)"][0] == "195.0 / 271.0 / 288.1"
    assert rows["misses: e2e p50 / p90 / p99 (ms)"][1] == "- / - / -"
    names = [name for name, _ in table_rows({"cache off": off})]
    assert not any(name.startswith(("hits", "misses")) for name in names)
    assert names.index("cache hit rate") + 1 == names.index("TTFT p50 / p90 / p99 (ms)")


def test_summary_and_table_tell_what_the_cache_saved() -> None:
    """The hits' completion tokens (a stored answer's own usage) and the generation time
    their X-Cache-Saved-Seconds told; misses, failed hits and untimed hits add no time."""
    records = _cache_run()
    hits = [r for r in records if r.cache_status == "Hit"]
    for i, r in enumerate(hits):
        r.completion_tokens = 20
        r.saved_seconds = None if i < 2 else 1.5  # two seeded entries: no time
    failed = _record(31, "Hit", 0.01)
    failed.error, failed.completion_tokens, failed.saved_seconds = "timeout", 20, 9.0
    summary = summarize([*records, failed], 20.0)
    assert summary["saved_by_cache"] == {"tokens": 200, "seconds": 12.0, "hits_without_seconds": 2}
    rows = dict(table_rows({"run": summary}))
    assert rows["saved by the cache"] == [
        "200 tokens, 12.0 s of generation (2 hits without a time)"
    ]
    for r in hits:
        r.saved_seconds = 1.5
    timed = summarize(records, 20.0)
    assert dict(table_rows({"run": timed}))["saved by the cache"] == [
        "200 tokens, 15.0 s of generation"
    ]


def test_truncation_warning_rule() -> None:
    def warnings(cut: int, workload: str = "repeat") -> list[str]:
        return truncation_warnings(workload, {"run": summarize(_cache_run(cut), 20.0)})

    assert warnings(16) == [WARNING]
    assert len(warnings(5)) == 1  # 25% of the misses
    assert warnings(4) == []  # 20%
    assert warnings(16, "sharegpt") == []  # not meant to hit the cache
    two = [_record(0, "Miss", 0.1, "length"), _record(1, "Miss", 0.1)]
    one = truncation_warnings("repeat", {"run": summarize(two, 1.0)})
    assert one == []  # half of the misses, but only one
    sides = {"cache on": summarize(_cache_run(16), 20.0), "cache off": summarize(two, 1.0)}
    assert truncation_warnings("repeat", sides) == [f"cache on: {WARNING}"]


def _git(root: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=root, check=True, capture_output=True, text=True).stdout


def test_git_commit_of_a_checkout_and_of_none(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("1")
    _git(tmp_path, "add", "f")
    _git(tmp_path, "commit", "-qm", "c")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD").strip()
    assert len(head) >= 7 and git_commit(tmp_path) == head
    (tmp_path / "new").write_text("untracked files do not count, as in git describe --dirty")
    assert git_commit(tmp_path) == head
    (tmp_path / "f").write_text("2")
    assert git_commit(tmp_path) == head + "-dirty"


def test_header_and_meta(run_info: RunInfo) -> None:
    info = dataclasses.replace(
        run_info,
        options=WorkloadOptions(20, max_output_tokens=32),
        settings={"cache on": "semgate serve --redis-data-dir DIR", "cache off": "semgate serve"},
        extra={"rounds": 2},
    )
    lines = info.header().splitlines()
    assert lines[0] == "- date: 2026-11-26T05:00:00Z; commit: `abc1234`"
    assert lines[1:3] == [
        "- cache on: `semgate serve --redis-data-dir DIR`",
        "- cache off: `semgate serve`",
    ]
    assert lines[3].startswith("- workload: `sharegpt` (num_requests=20, max_prompt_tokens=1024,")
    assert "max_output_tokens=32" in lines[3]
    assert lines[4] == "- load: open loop, Poisson arrivals at 2 req/s, for at most 600 s, seed 0"
    meta = info.as_dict()
    assert (meta["date"], meta["commit"], meta["rounds"]) == ("2026-11-26T05:00:00Z", "abc1234", 2)
    assert meta["options"]["max_output_tokens"] == 32 and meta["shape"]["rate"] == 2.0
    assert meta["settings"] == info.settings


def test_cdfs_split_by_cache_status_with_percentile_markers() -> None:
    on = _cache_run()
    off = [_record(i, "Bypass", 0.1 + i / 100) for i in range(5)]
    curves = cdfs({"cache on": on, "cache off": off})
    assert [c.label for c in curves["ttft"]] == ["cache on: hits", "cache on: misses", "cache off"]
    assert [c.label for c in curves["itl"]] == ["cache on: misses", "cache off"]  # hits: no gaps
    summary = summarize(on, 20.0)
    for cdf, group in zip(curves["e2e"][:2], ("hits", "misses"), strict=True):
        stats = summary[group]["e2e"]
        names, xs, ys = zip(*cdf.markers, strict=True)
        assert names == ("p50", "p90", "p99") and ys == (0.5, 0.9, 0.99)
        assert xs == pytest.approx([stats[f"p{p}_ms"] for p in (50, 90, 99)])
        assert cdf.ys[-1] == 1.0 and list(cdf.xs) == sorted(cdf.xs)


def test_plots_label_the_series_and_the_offered_load(tmp_path: Path) -> None:
    runs = {"cache on": _cache_run()}
    fig = latency_cdfs(runs, tmp_path / "cdf.png")
    ttft_ax = fig.axes[0]
    assert ttft_ax.get_legend_handles_labels()[1] == ["cache on: hits", "cache on: misses"]
    marks = [t.get_text() for t in ttft_ax.texts]
    assert marks == ["p50", "p90", "p99"] * 2
    assert (tmp_path / "cdf.png").stat().st_size > 0
    open_loop = throughput_over_time(runs, tmp_path / "t.png", LoadShape(rate=2.0))
    assert "offered: 2 req/s" in open_loop.axes[1].get_legend_handles_labels()[1]
    closed = throughput_over_time(runs, tmp_path / "t.png", LoadShape(concurrency=4))
    assert "offered load: closed loop, 4 in flight" in closed.axes[0].get_title()
    assert closed.axes[1].get_legend_handles_labels()[1] == ["cache on"]


def test_report_warns_at_the_top(tmp_path: Path, run_info: RunInfo) -> None:
    info = dataclasses.replace(run_info, workload="repeat")
    runs = {"repeat": _cache_run(misses_cut=16)}
    summaries = {"repeat": summarize(runs["repeat"], 20.0)}
    text = write_run_report(tmp_path, "Load test", "intro", runs, summaries, info).read_text()
    assert text.startswith(f"# Load test\n\n> **Warning**: {WARNING}\n\n- date: ")
    assert "| hits: TTFT p50 / p90 / p99 (ms) | 14.5 / 18.1 / 18.9 |" in text
    plain = markdown_report("t", "intro", summaries, [], run_info)  # not a cache workload
    assert "Warning" not in plain and plain.startswith("# t\n\n- date: ")
    console = Console(record=True, width=400)
    print_table(console, summaries, "load test", "repeat")
    assert console.export_text().startswith(f"warning: {WARNING}\n")

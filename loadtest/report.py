"""Results on disk: the JSON results, the PNG plots and a short Markdown report, and the
same summary table on the terminal."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loadtest.meta import RunInfo
from loadtest.phases import PART_LABELS, STALL_FACTOR, TTFT_PARTS
from loadtest.plots import Runs, write_plots
from loadtest.workload import CACHE_WORKLOADS

Summaries = dict[str, dict[str, Any]]
# A cache workload's run is flagged when at least this share of its misses, and at least
# TRUNCATED_LEAST of them, ended at the output limit.
TRUNCATED_SHARE = 0.25
TRUNCATED_LEAST = 2


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _pcts(stats: dict[str, Any]) -> str:
    return " / ".join(_ms(stats[k]) for k in ("p50_ms", "p90_ms", "p99_ms"))


def table_rows(summaries: Summaries) -> list[tuple[str, list[str]]]:
    """(metric, one cell per run) for the summary table."""

    def row(name: str, cell: Any) -> tuple[str, list[str]]:
        return name, [cell(s) for s in summaries.values()]

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    # Hits and misses apart, only where a run had hits: else the rows would repeat the
    # overall ones (all misses) or say nothing (a server without a cache).
    by_status = [
        row("hits / misses", lambda s: f"{s['hits']['requests']} / {s['misses']['requests']}"),
        *(
            row(f"{group}: {name} p50 / p90 / p99 (ms)", lambda s, g=group, k=key: _pcts(s[g][k]))
            for group in ("hits", "misses")
            for key, name in (("ttft", "TTFT"), ("e2e", "e2e"))
        ),
        row("saved by the cache", _saved),
    ]
    return [
        row("requests: completed / sent", lambda s: f"{s['completed']} / {s['requests']}"),
        row("error rate", lambda s: rate(s["error_rate"])),
        row("request throughput (req/s)", lambda s: f"{s['request_throughput']:.2f}"),
        row("output throughput (tok/s)", lambda s: f"{s['output_token_throughput']:.1f}"),
        row("cache hit rate", lambda s: rate(s["cache_hit_rate"])),
        *(by_status if any(s["hits"]["requests"] for s in summaries.values()) else []),
        row("TTFT p50 / p90 / p99 (ms)", lambda s: _pcts(s["ttft"])),
        row("ITL p50 / p90 / p99 (ms)", lambda s: _pcts(s["itl"])),
        row("e2e p50 / p90 / p99 (ms)", lambda s: _pcts(s["e2e"])),
        row(
            "ITL during long prefills p50 / p90 / p99",
            lambda s: _pcts(s["itl_during_long_prefill"]),
        ),
        row("long prompts: TTFT p50 / p99 (ms)", _long_ttft),
    ]


def _saved(summary: dict[str, Any]) -> str:
    """Tokens the hits did not generate and the generation time they did not spend, with
    the hits whose time the server did not tell (seeded entries, or no semgate)."""
    saved = summary["saved_by_cache"]
    cell = f"{saved['tokens']:,} tokens, {saved['seconds']:,.1f} s of generation"
    untimed = saved["hits_without_seconds"]
    return cell + (f" ({untimed} hits without a time)" if untimed else "")


def _long_ttft(summary: dict[str, Any]) -> str:
    stats = summary["long"]["ttft"]
    return "-" if not stats["n"] else f"{_ms(stats['p50_ms'])} / {_ms(stats['p99_ms'])}"


def truncation_warnings(workload: str, summaries: Summaries) -> list[str]:
    """One warning per run of a cache workload whose misses often ended at the output
    limit: such answers are never stored, so the run had little or nothing to hit."""
    if workload not in CACHE_WORKLOADS:
        return []
    warnings = []
    for label, summary in summaries.items():
        misses = summary["misses"]
        cut = misses["at_output_limit"]
        if cut >= TRUNCATED_LEAST and cut >= TRUNCATED_SHARE * misses["requests"]:
            prefix = f"{label}: " if len(summaries) > 1 else ""
            warnings.append(
                f"{prefix}{cut} of {misses['requests']} misses ended at the output limit "
                f"(max_tokens={misses['max_tokens']}): truncated answers are never stored in "
                "the cache, so this run cannot measure hits; raise --max-output-tokens."
            )
    return warnings


def markdown_table(summaries: Summaries) -> str:
    lines = ["| metric | " + " | ".join(summaries) + " |", "|---" * (len(summaries) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in table_rows(summaries)]
    return "\n".join(lines)


def print_table(console: Console, summaries: Summaries, title: str, workload: str) -> None:
    for warning in truncation_warnings(workload, summaries):
        console.print(f"[bold red]warning[/]: {escape(warning)}")
    table = Table(title=title)
    table.add_column("metric")
    for label in summaries:
        table.add_column(label, justify="right")
    for name, cells in table_rows(summaries):
        table.add_row(name, *cells)
    console.print(table)
    for label, summary in summaries.items():
        phases = summary["phases"]
        diagnosis = phases["diagnosis"] if phases else "the server reports no phases"
        console.print(f"where the time goes ({label}): {diagnosis}")


def records_json(runs: Runs) -> dict[str, list[dict[str, Any]]]:
    return {label: [dataclasses.asdict(r) for r in records] for label, records in runs.items()}


def phases_markdown(label: str, summary: dict[str, Any]) -> str:
    """One run's part of the 'Where the time goes' section."""
    phases = summary["phases"]
    if phases is None:
        return (
            f"**{label}**: the server reports no phases (no `Server-Timing` header, "
            "no `timings` in the stream)."
        )
    lines = [
        f"**{label}** ({phases['timed_requests']} of {summary['completed']} completed "
        "requests reported phases):",
        "",
        "| TTFT | requests | " + " | ".join(PART_LABELS[p] for p in TTFT_PARTS) + " |",
        "|---" * (len(TTFT_PARTS) + 2) + "|",
    ]
    for pct, group in phases["ttft"].items():
        shares = " | ".join(f"{group['shares'][p]:.0%}" for p in TTFT_PARTS)
        lines.append(f"| {pct} | {group['requests']} | {shares} |")
    lines += ["", _stalls(phases["stalls"])]
    of_e2e = [
        f"{phase} {share:.0%}"
        for phase in ("prefill", "decode")
        if (share := phases[f"{phase}_share_of_e2e"]) is not None
    ]
    if of_e2e:
        lines.append("Of end-to-end time: " + ", ".join(of_e2e) + ".")
    lines += ["", f"Diagnosis: {phases['diagnosis']}."]
    return "\n".join(lines)


def _stalls(stalls: dict[str, Any]) -> str:
    if not stalls["gaps"]:
        return "Stalls: no inter-token gaps."
    head = (
        f"Stalls (gaps of {STALL_FACTOR:g}x the median gap of {stalls['median_gap_ms']:,.1f} ms "
        f"or more, {stalls['threshold_ms']:,.1f} ms)"
    )
    n = stalls["stalls"]
    if not n:
        return f"{head}: none in {stalls['gaps']:,} gaps."
    return (
        f"{head}: {n:,} of {stalls['gaps']:,} gaps ({n / stalls['gaps']:.1%}), median "
        f"{stalls['median_stall_ms']:,.1f} ms, adding {stalls['time_share']:.0%} to the time "
        f"between tokens; {stalls['during_prefill']:,} of them "
        f"({stalls['during_prefill'] / n:.0%}) coincide with another request's prefill."
    )


def markdown_report(
    title: str, intro: str, summaries: Summaries, plots: list[Path], info: RunInfo
) -> str:
    warnings = "".join(
        f"> **Warning**: {w}\n\n" for w in truncation_warnings(info.workload, summaries)
    )
    images = "\n\n".join(f"![{p.stem}]({p.name})" for p in plots)
    phases = "\n\n".join(phases_markdown(label, s) for label, s in summaries.items())
    return (
        f"# {title}\n\n{warnings}{info.header()}\n\n{intro}\n\n{markdown_table(summaries)}\n\n"
        f"## Where the time goes\n\n{phases}\n\n{images}\n"
    )


def write_run_report(
    out_dir: Path, title: str, intro: str, runs: Runs, summaries: Summaries, info: RunInfo
) -> Path:
    """results.json, the plots and report.md in `out_dir`; returns the report's path."""
    from bench.report import write_report

    plots = write_plots(runs, out_dir, summaries, info.shape)
    write_report(
        out_dir / "results.json",
        {"meta": info.as_dict(), "summary": summaries, "requests": records_json(runs)},
    )
    report = out_dir / "report.md"
    report.write_text(markdown_report(title, intro, summaries, plots, info))
    return report

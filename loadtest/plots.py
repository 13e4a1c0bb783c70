"""PNG plots of one run or of several side by side (label -> records), drawn on
matplotlib Figures directly (the Agg canvas; no pyplot state, no display)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from loadtest.phases import PART_LABELS, TTFT_PARTS
from loadtest.record import RequestRecord
from loadtest.runner import LoadShape
from loadtest.summary import cache_split, latency_samples

Runs = dict[str, list[RequestRecord]]

_LATENCY_NAMES = {"ttft": "TTFT", "itl": "ITL", "e2e": "end-to-end"}
MARKED_PERCENTILES = (50, 90, 99)


def cache_groups(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """A run's completed requests as the series its latency plots show: hits and misses
    apart ({"hits": ..., "misses": ...}) where it had hits, else all together ({"": ...})."""
    done = [r for r in records if r.ok]
    split = cache_split(done)
    return split if split["hits"] else {"": done}


def series(runs: Runs) -> dict[str, list[RequestRecord]]:
    """Every run's cache groups by series label: "LABEL: hits", "LABEL: misses" or "LABEL"."""
    return {
        f"{label}: {group}" if group else label: group_records
        for label, records in runs.items()
        for group, group_records in cache_groups(records).items()
    }


@dataclass(frozen=True)
class Cdf:
    label: str
    xs: np.ndarray  # the samples in ms, sorted
    ys: np.ndarray  # the fraction of samples at or below each
    markers: list[tuple[str, float, float]]  # ("p50", ms, fraction) at MARKED_PERCENTILES


def cdfs(runs: Runs) -> dict[str, list[Cdf]]:
    """Per latency (ttft, itl, e2e), a CDF for each series that has samples of it."""
    out: dict[str, list[Cdf]] = {key: [] for key in _LATENCY_NAMES}
    for label, records in series(runs).items():
        for key, values in latency_samples(records).items():
            if not values:
                continue
            xs = np.sort(values) * 1e3
            # Percentiles as the summary takes them (linear interpolation), not sample ranks.
            at = np.percentile(xs, MARKED_PERCENTILES)
            markers = [
                (f"p{p}", float(x), p / 100) for p, x in zip(MARKED_PERCENTILES, at, strict=True)
            ]
            out[key].append(Cdf(label, xs, np.arange(1, len(xs) + 1) / len(xs), markers))
    return out


def latency_cdfs(runs: Runs, path: Path) -> Figure:
    """TTFT, ITL and e2e CDFs, a dot and a label at each series' p50, p90 and p99;
    returns the figure written to `path`."""
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = dict(zip(_LATENCY_NAMES, fig.subplots(1, 3), strict=True))
    for key, curves in cdfs(runs).items():
        for cdf in curves:
            (line,) = axes[key].step(cdf.xs, cdf.ys, where="post", label=cdf.label)
            for name, x, y in cdf.markers:
                axes[key].plot(x, y, "o", color=line.get_color(), ms=4)
                axes[key].annotate(
                    name, (x, y), xytext=(3, -9), textcoords="offset points", fontsize=7
                )
    for key, ax in axes.items():
        name = _LATENCY_NAMES[key]
        ax.set(xscale="log", xlabel=f"{name} (ms, log scale)", ylabel="fraction of samples")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{name} CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best")
    fig.savefig(path, dpi=110)
    return fig


def itl_over_time(runs: Runs, path: Path) -> Figure:
    """Each inter-token gap at the time its chunk arrived, hits' and misses' apart where a
    run had hits; red lines where long prompts were sent. Returns the figure."""
    fig = Figure(figsize=(13, 3.2 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (label, records) in zip(axes, runs.items(), strict=True):
        for group, group_records in cache_groups(records).items():
            times = [t for r in group_records for t in r.chunk_times()[1:]]
            if times:  # a semgate hit is replayed in one chunk: no gaps
                gaps = [gap * 1e3 for r in group_records for gap in r.itl]
                name = f"inter-token gap ({group})" if group else "inter-token gap"
                ax.scatter(times, gaps, s=4, alpha=0.5, label=name)
        for i, r in enumerate(r for r in records if r.long):
            ax.axvline(r.sent_at, color="red", ls="--", lw=0.8, label=None if i else "long prompt")
        ax.set(yscale="log", ylabel="ITL (ms, log scale)", title=f"ITL over time: {label}")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best")
    axes[-1].set_xlabel("time since the start of the run (s)")
    fig.savefig(path, dpi=110)
    return fig


def _token_times(records: list[RequestRecord]) -> tuple[list[float], list[float]]:
    """Chunk arrival times and the output tokens each carried (a request's usage count
    spread evenly over its chunks)."""
    times: list[float] = []
    weights: list[float] = []
    for r in records:
        chunks = r.chunk_times()
        if r.ok and chunks and r.completion_tokens:
            times += chunks
            weights += [r.completion_tokens / len(chunks)] * len(chunks)
    return times, weights


def throughput_over_time(runs: Runs, path: Path, shape: LoadShape, bin_s: float = 2.0) -> Figure:
    """Output tokens and completed requests per second, and the offered load: the rate as
    a line for an open loop, the concurrency in the title for a closed one. Returns the
    figure."""
    fig = Figure(figsize=(13, 6), layout="constrained")
    tokens_ax, requests_ax = fig.subplots(2, 1, sharex=True)
    for label, records in runs.items():
        times, weights = _token_times(records)
        ends = [r.finished_at for r in records if r.ok and r.finished_at is not None]
        if not ends:
            continue
        edges = np.arange(0.0, max(ends) + bin_s, bin_s)
        tokens, _ = np.histogram(times, bins=edges, weights=weights)
        requests, _ = np.histogram(ends, bins=edges)
        tokens_ax.stairs(tokens / bin_s, edges, label=label)
        requests_ax.stairs(requests / bin_s, edges, label=label)
    if shape.rate is not None:
        requests_ax.axhline(
            shape.rate, color="black", ls="--", lw=1, label=f"offered: {shape.rate:g} req/s"
        )
    title = f"Throughput over time ({bin_s:g} s bins; offered load: {shape.describe()})"
    tokens_ax.set(ylabel="output tokens/s", title=title)
    requests_ax.set(ylabel="completed requests/s", xlabel="time since the start of the run (s)")
    for ax in (tokens_ax, requests_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best")
    fig.savefig(path, dpi=110)
    return fig


def ttft_split(summaries: dict[str, dict[str, Any]], path: Path) -> None:
    """A stacked bar of the TTFT parts' shares per percentile, for each run that reported
    phases."""
    bars = [
        (f"{label}\n{pct}" if len(summaries) > 1 else pct, group["shares"])
        for label, summary in summaries.items()
        if summary["phases"] is not None
        for pct, group in summary["phases"]["ttft"].items()
    ]
    fig = Figure(figsize=(max(4.0, 1.4 * len(bars) + 2), 4), layout="constrained")
    ax = fig.subplots()
    bottom = np.zeros(len(bars))
    for part in TTFT_PARTS:
        heights = np.array([shares[part] for _, shares in bars])
        ax.bar(
            [name for name, _ in bars], heights, bottom=bottom, label=PART_LABELS[part], width=0.6
        )
        bottom += heights
    ax.set(ylabel="share of TTFT", ylim=(0, 1), title="Where the TTFT goes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=110)


def write_plots(
    runs: Runs, out_dir: Path, summaries: dict[str, dict[str, Any]], shape: LoadShape
) -> list[Path]:
    """The three plots as PNGs in `out_dir`, and the TTFT split when a run in `summaries`
    reported phases; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ("latency_cdf.png", "itl_over_time.png", "throughput.png")]
    latency_cdfs(runs, paths[0])
    itl_over_time(runs, paths[1])
    throughput_over_time(runs, paths[2], shape)
    if any(s["phases"] is not None for s in summaries.values()):
        paths.append(out_dir / "ttft_split.png")
        ttft_split(summaries, paths[-1])
    return paths

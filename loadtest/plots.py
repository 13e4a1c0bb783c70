"""PNG plots of one run or of several side by side (label -> records), drawn on
matplotlib Figures directly (the Agg canvas; no pyplot state, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from loadtest.phases import PART_LABELS, TTFT_PARTS
from loadtest.record import RequestRecord
from loadtest.summary import latency_samples

Runs = dict[str, list[RequestRecord]]

_LATENCY_NAMES = {"ttft": "TTFT", "itl": "ITL", "e2e": "end-to-end"}


def latency_cdfs(runs: Runs, path: Path) -> None:
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = dict(zip(_LATENCY_NAMES, fig.subplots(1, 3), strict=True))
    for label, records in runs.items():
        for key, values in latency_samples([r for r in records if r.ok]).items():
            if values:
                xs = np.sort(values) * 1e3
                axes[key].step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)
    for key, ax in axes.items():
        name = _LATENCY_NAMES[key]
        ax.set(xscale="log", xlabel=f"{name} (ms, log scale)", ylabel="fraction of samples")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{name} CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best")
    fig.savefig(path, dpi=110)


def itl_over_time(runs: Runs, path: Path) -> None:
    """Each inter-token gap at the time its chunk arrived; red lines where long prompts
    were sent."""
    fig = Figure(figsize=(13, 3.2 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (label, records) in zip(axes, runs.items(), strict=True):
        times = [t for r in records if r.ok for t in r.chunk_times()[1:]]
        gaps = [gap * 1e3 for r in records if r.ok for gap in r.itl]
        ax.scatter(times, gaps, s=4, alpha=0.5, label="inter-token gap")
        for i, r in enumerate(r for r in records if r.long):
            ax.axvline(r.sent_at, color="red", ls="--", lw=0.8, label=None if i else "long prompt")
        ax.set(yscale="log", ylabel="ITL (ms, log scale)", title=f"ITL over time: {label}")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best")
    axes[-1].set_xlabel("time since the start of the run (s)")
    fig.savefig(path, dpi=110)


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


def throughput_over_time(runs: Runs, path: Path, bin_s: float = 2.0) -> None:
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
    tokens_ax.set(ylabel="output tokens/s", title=f"Throughput over time ({bin_s:g} s bins)")
    requests_ax.set(ylabel="completed requests/s", xlabel="time since the start of the run (s)")
    for ax in (tokens_ax, requests_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best")
    fig.savefig(path, dpi=110)


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


def write_plots(runs: Runs, out_dir: Path, summaries: dict[str, dict[str, Any]]) -> list[Path]:
    """The three plots as PNGs in `out_dir`, and the TTFT split when a run in `summaries`
    reported phases; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ("latency_cdf.png", "itl_over_time.png", "throughput.png")]
    for draw, path in zip((latency_cdfs, itl_over_time, throughput_over_time), paths, strict=True):
        draw(runs, path)
    if any(s["phases"] is not None for s in summaries.values()):
        paths.append(out_dir / "ttft_split.png")
        ttft_split(summaries, paths[-1])
    return paths

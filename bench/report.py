"""What every `semgate bench ...` and the load tests share: alternation and medians,
latency summaries, the progress bar, the "met?" cell and the JSON report (no engine:
the load generator uses it too)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

T = TypeVar("T")


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """items rotated left by shift, so repeats alternate which side goes first."""
    k = shift % len(items)
    return [*items[k:], *items[:k]]


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def fmt(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def summary_ms(values_s: Sequence[float]) -> dict[str, Any]:
    """n, p50, p90 and p99 in milliseconds of durations given in seconds (linear
    interpolation between samples, so p99 of 100 samples is not simply the maximum)."""
    if not values_s:
        return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None}
    p50, p90, p99 = np.percentile(np.asarray(values_s) * 1e3, [50, 90, 99])
    return {"n": len(values_s), "p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99)}


def progress(console: Console) -> Progress:
    """A progress bar (a context manager) with a spinner, counts and elapsed time."""
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console)


def met_cell(met: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[met]


def write_report(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")

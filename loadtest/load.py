"""One load test: build the workload, drive the endpoint, summarise, write the report."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from loadtest.client import Endpoint
from loadtest.report import print_table, write_run_report
from loadtest.runner import LoadShape, RunResult, run_load
from loadtest.summary import summarize
from loadtest.work_item import WorkloadOptions
from loadtest.workload import build_workload


@dataclass(frozen=True)
class LoadTest:
    workload: str
    options: WorkloadOptions
    endpoint: Endpoint
    shape: LoadShape

    def describe(self) -> str:
        return (
            f"`{self.workload}` workload, {self.shape.describe()}, at most "
            f"{self.options.num_requests} requests and {self.shape.duration:g} s, "
            f"against {self.endpoint.url}."
        )

    def meta(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "options": asdict(self.options),
            "endpoint": {**asdict(self.endpoint), "api_key": None},  # never written to disk
            "shape": asdict(self.shape),
        }


def run_load_test(test: LoadTest, out_dir: Path, console: Console) -> tuple[RunResult, Path]:
    with console.status(f"building the {test.workload} workload ..."):
        items = build_workload(test.workload, test.options)
    result = asyncio.run(run_load(items, test.endpoint, test.shape, console, test.workload))
    summary = summarize(result.records, result.elapsed)
    print_table(console, {test.workload: summary}, "load test")
    report = write_run_report(
        out_dir,
        "Load test",
        test.describe(),
        {test.workload: result.records},
        {test.workload: summary},
        test.meta(),
    )
    return result, report

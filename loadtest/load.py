"""One load test: build the workload, drive the endpoint, summarise, write the report."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.console import Console

from loadtest.client import Endpoint
from loadtest.meta import RunInfo
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

    def info(self, models: list[str] | None) -> RunInfo:
        """What the report's header says: all the load test knows of the server."""
        endpoint = self.endpoint
        return RunInfo(
            self.workload,
            self.options,
            self.shape,
            settings={
                "endpoint": endpoint.url,
                "models listed by the server": "unknown" if models is None else ", ".join(models),
                "requests": f"model={endpoint.model}, temperature={endpoint.temperature:g}, "
                f"ignore_eos={endpoint.ignore_eos}, timeout={endpoint.timeout:g} s",
            },
            extra={"endpoint": {**asdict(endpoint), "api_key": None}},  # never written to disk
        )


def listed_models(endpoint: Endpoint) -> list[str] | None:
    """The model ids the server's GET /v1/models lists; None where it does not answer so."""
    url = endpoint.url.removesuffix("/chat/completions") + "/models"
    try:
        response = httpx.get(url, headers=endpoint.headers(), timeout=10.0)
        response.raise_for_status()
        return [str(model["id"]) for model in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def run_load_test(test: LoadTest, out_dir: Path, console: Console) -> tuple[RunResult, Path]:
    with console.status(f"building the {test.workload} workload ..."):
        items = build_workload(test.workload, test.options)
    info = test.info(listed_models(test.endpoint))
    result = asyncio.run(run_load(items, test.endpoint, test.shape, console, test.workload))
    summary = summarize(result.records, result.elapsed)
    print_table(console, {test.workload: summary}, "load test", test.workload)
    report = write_run_report(
        out_dir,
        "Load test",
        test.describe(),
        {test.workload: result.records},
        {test.workload: summary},
        info,
    )
    return result, report

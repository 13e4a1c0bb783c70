"""Runs a scenario: starts one `semgate serve` per side, sends both the same workload at the
same offered load in alternating rounds (A B, B A, ...), and writes one comparison report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from loadtest.client import Endpoint
from loadtest.headline import Headline
from loadtest.meta import RunInfo
from loadtest.record import RequestRecord
from loadtest.report import print_table, write_run_report
from loadtest.runner import LoadShape, run_load
from loadtest.scenarios import Scenario, Side
from loadtest.summary import summarize
from loadtest.work_item import WorkItem, WorkloadOptions
from loadtest.workload import build_workload


@dataclass(frozen=True)
class ScenarioRun:
    scenario: Scenario
    rounds: int = 2
    num_threads: int = 1  # the engine's CPU threads in each server
    timeout: float = 300.0
    model: str = "smollm2-135m-instruct"
    seed: int = 0

    def serve_args(self, side: Side, redis_dir: str | None) -> list[str]:
        cache = ["--redis-data-dir", redis_dir] if redis_dir else ["--no-cache"]
        return ["--num-threads", str(self.num_threads), *side.serve_args, *cache]

    def command(self, side: Side) -> str:
        """The side's server command line, for the report."""
        args = self.serve_args(side, "DIR" if side.cache else None)
        return "semgate serve " + " ".join(args)


def _warm_up(endpoint: Endpoint) -> None:
    """One short request, so the first measured one pays no first-call costs; not cached,
    so the cache starts the run empty."""
    item = WorkItem([{"role": "user", "content": "Say hi."}], 8, exact_length=False, kind="warm-up")
    no_store = dataclasses.replace(endpoint, cache_store=False)
    record = asyncio.run(run_load([item], no_store, LoadShape(concurrency=1))).records[0]
    if not record.ok:
        raise RuntimeError(
            f"warm-up request to {endpoint.url} failed: {record.error} {record.error_message or ''}"
        )


def _describe(run: ScenarioRun, shape: LoadShape, count: int) -> str:
    """The scenario in prose; the servers' command lines are in the report's header."""
    scenario = run.scenario
    return (
        f"{scenario.about}\n\n`{scenario.workload}` workload, {count} requests a side in "
        f"{run.rounds} alternating rounds, {shape.describe()}."
    )


def _drive(
    run: ScenarioRun,
    items: list[WorkItem],
    shape: LoadShape,
    endpoints: dict[str, Endpoint],
    console: Console,
) -> tuple[dict[str, list[RequestRecord]], dict[str, float]]:
    """Each round's slice of the workload on every side (by label), alternating which side
    goes first; the rounds' records are laid end to end on one timeline per side."""
    order = list(endpoints)
    runs: dict[str, list[RequestRecord]] = {label: [] for label in order}
    elapsed = dict.fromkeys(order, 0.0)
    for r, indices in enumerate(np.array_split(np.arange(len(items)), run.rounds)):
        round_shape = dataclasses.replace(shape, seed=shape.seed + r)
        chunk = [items[i] for i in indices]
        first = int(indices[0])
        for label in order if r % 2 == 0 else order[::-1]:
            progress = f"{label} ({r + 1}/{run.rounds})"
            result = asyncio.run(run_load(chunk, endpoints[label], round_shape, console, progress))
            runs[label] += [
                dataclasses.replace(
                    rec, index=rec.index + first, sent_at=rec.sent_at + elapsed[label]
                )
                for rec in result.records
            ]
            elapsed[label] += result.elapsed
    return runs, elapsed


def run_scenario(
    run: ScenarioRun, options: WorkloadOptions, shape: LoadShape, out_dir: Path, console: Console
) -> Path:
    """Runs the scenario and writes its report into `out_dir`; returns the report's path."""
    from gateway.serve_process import ServeProcess, serving

    scenario = run.scenario
    if not 1 <= run.rounds <= options.num_requests:
        raise ValueError(
            f"--rounds must be between 1 and the {options.num_requests} requests of a side"
        )
    with console.status(f"building the {scenario.workload} workload ..."):
        items = build_workload(scenario.workload, options)
    started = RunInfo(
        scenario.workload,
        options,
        shape,
        settings={side.label: run.command(side) for side in scenario.sides},
    )
    with contextlib.ExitStack() as stack:
        servers = []
        for side in scenario.sides:
            redis_dir = stack.enter_context(tempfile.TemporaryDirectory()) if side.cache else None
            servers.append(ServeProcess(run.serve_args(side, redis_dir)))
        endpoints = {
            side.label: Endpoint(Endpoint.chat_url(server.url), run.model, timeout=run.timeout)
            for side, server in zip(scenario.sides, servers, strict=True)
        }
        with console.status("starting the servers ..."):
            stack.enter_context(serving(*servers))
            for endpoint in endpoints.values():
                _warm_up(endpoint)
        runs, elapsed = _drive(run, items, shape, endpoints, console)
    summaries = {label: summarize(records, elapsed[label]) for label, records in runs.items()}
    headline = Headline.of(scenario.headline_name, scenario.headline, summaries, scenario.goal)
    print_table(console, summaries, f"scenario {scenario.name}", scenario.workload)
    console.print(headline.text().replace("**", ""))
    extra = {"scenario": scenario.name, "headline": headline.as_dict(), "rounds": run.rounds}
    info = dataclasses.replace(started, extra=extra)
    intro = _describe(run, shape, len(items)) + "\n\n" + headline.text()
    return write_run_report(out_dir, f"Scenario: {scenario.name}", intro, runs, summaries, info)

"""Runs a scenario: starts one `semgate serve` per side (and the engine servers behind it,
where it forwards), sends both the same workload at the same offered load in alternating
rounds (A B, B A, ...), and writes one comparison report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console

from loadtest.client import Endpoint
from loadtest.headline import Headline
from loadtest.meta import RunInfo
from loadtest.record import RequestRecord
from loadtest.report import print_table, write_run_report
from loadtest.runner import LoadShape, run_load
from loadtest.scenarios import Scenario, Side
from loadtest.server_stats import Snapshot, between, snapshot, table
from loadtest.summary import summarize
from loadtest.work_item import WorkItem, WorkloadOptions
from loadtest.workload import build_workload

if TYPE_CHECKING:
    from gateway.serve_process import ServeProcess


@dataclass(frozen=True)
class ScenarioRun:
    scenario: Scenario
    rounds: int = 2
    num_threads: int = 1  # the engine's CPU threads in each server
    timeout: float = 300.0
    model: str = "smollm2-135m-instruct"
    seed: int = 0

    def serve_args(self, side: Side, redis_dir: str | None, engines: list[str]) -> list[str]:
        """The side's server: its engine runs in it, or forwards to `engines` (URLs)."""
        cache = ["--redis-data-dir", redis_dir] if redis_dir else ["--no-cache"]
        if engines:
            return [*side.serve_args, *cache, "--upstream", f"{self.model}={','.join(engines)}"]
        return ["--num-threads", str(self.num_threads), *side.serve_args, *cache]

    def engine_args(self) -> list[str]:
        return ["--no-cache", "--num-threads", str(self.num_threads), *self.scenario.engine_args]

    def command(self, side: Side) -> str:
        """The side's server command line (and its engine servers'), for the report."""
        engines = [f"ENGINE{i + 1}" for i in range(side.engines)]
        args = self.serve_args(side, "DIR" if side.cache else None, engines)
        line = "semgate serve " + " ".join(args)
        if engines:
            line += f"`; ENGINE1..{side.engines}: `semgate serve " + " ".join(self.engine_args())
        return line


def warm_up(endpoint: Endpoint) -> None:
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


def _servers_text(scenario: Scenario, servers: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The engine servers' table, and the busiest one's share against the goal."""
    text = "Requests each engine server got, why the gateway chose it, and its own "
    text += "prefix-cache hit rate (of prompt tokens looked up):\n\n" + table(servers)
    if scenario.max_server_share is not None:
        label = scenario.sides[0].label
        busiest = max((s["share"] or 0.0) for s in servers[label].values())
        met = "met" if busiest <= scenario.max_server_share else "not met"
        text += (
            f"\n\nBusiest {label} server: {busiest:.0%} of its requests (goal: at most "
            f"{scenario.max_server_share:.0%}; {met})."
        )
    return text


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
        servers, engines = [], {}
        for side in scenario.sides:
            redis_dir = stack.enter_context(tempfile.TemporaryDirectory()) if side.cache else None
            engines[side.label] = [ServeProcess(run.engine_args()) for _ in range(side.engines)]
            urls = [engine.url for engine in engines[side.label]]
            servers.append(ServeProcess(run.serve_args(side, redis_dir, urls)))
        endpoints = {
            side.label: Endpoint(Endpoint.chat_url(server.url), run.model, timeout=run.timeout)
            for side, server in zip(scenario.sides, servers, strict=True)
        }
        gateways = {side.label: s.url for side, s in zip(scenario.sides, servers, strict=True)}
        with console.status("starting the servers ..."):
            # The engine servers first: a gateway is ready once one of its servers is.
            stack.enter_context(serving(*(e for side in engines.values() for e in side)))
            stack.enter_context(serving(*servers))
            for endpoint in endpoints.values():
                warm_up(endpoint)
        before = _snapshots(gateways, engines)
        runs, elapsed = _drive(run, items, shape, endpoints, console)
        after = _snapshots(gateways, engines)
        routed = {label: between(before[label], after[label]) for label in after}
    summaries = {label: summarize(records, elapsed[label]) for label, records in runs.items()}
    headline = Headline.of(scenario.headline_name, scenario.headline, summaries, scenario.goal)
    print_table(console, summaries, f"scenario {scenario.name}", scenario.workload)
    console.print(headline.text().replace("**", ""))
    extra = {"scenario": scenario.name, "headline": headline.as_dict(), "rounds": run.rounds}
    intro = _describe(run, shape, len(items)) + "\n\n" + headline.text()
    if routed:
        extra["servers"] = routed
        servers_text = _servers_text(scenario, routed)
        console.print(servers_text)
        intro += "\n\n" + servers_text
    info = dataclasses.replace(started, extra=extra)
    return write_run_report(out_dir, f"Scenario: {scenario.name}", intro, runs, summaries, info)


def _snapshots(
    gateways: dict[str, str], engines: dict[str, list[ServeProcess]]
) -> dict[str, Snapshot]:
    """Each forwarding side's routing and its engine servers' prefix caches, now."""
    return {
        label: snapshot(gateways[label], [e.url for e in side])
        for label, side in engines.items()
        if side
    }

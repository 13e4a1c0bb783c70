"""Runs the pd scenario: starts each side's KV store (a Redis Stack of its own, where its
engine servers use one), engine servers and gateway, then sends every side the same
requests at each rate of the sweep, alternating which side goes first, and collects the
records and what the servers' counters gained."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console

from loadtest.client import Endpoint
from loadtest.compare import warm_up
from loadtest.meta import git_commit, utc_now
from loadtest.pd_scenario import STORE_MAXMEMORY, PdSide, SweepRun
from loadtest.record import RequestRecord
from loadtest.runner import LoadShape, run_load
from loadtest.server_stats import counters, counters_between
from loadtest.work_item import WorkItem, WorkloadOptions
from loadtest.workload import build_workload

if TYPE_CHECKING:
    from cache.redis_server import EmbeddedRedis
    from gateway.serve_process import ServeProcess

# What the report shows of the servers' /metrics: the KV transfers of the engine servers
# and the gateway's routing and P/D decisions.
ENGINE_COUNTERS = ("semgate_kv_",)
GATEWAY_COUNTERS = ("semgate_pd_", "semgate_upstream_requests")
NO_LIMIT = 1e9  # seconds: a rate's run ends when its requests are sent and answered


@dataclass
class SweepResult:
    """What a sweep measured; the SLOs judge it afterwards (loadtest/sweep_report.py), so
    an earlier run's results.json can be judged again against others."""

    settings: dict[str, str]  # side -> its servers' command lines; the feature's side first
    options: WorkloadOptions  # num_requests: per rate and side
    rates: tuple[float, ...]
    seed: int
    records: dict[str, dict[float, list[RequestRecord]]]  # side -> rate -> records
    elapsed: dict[str, dict[float, float]]  # side -> rate -> seconds to the last answer
    # side -> server (GATEWAY, ENGINE1, PREFILL1, ...) -> counter -> gain over the sweep
    servers: dict[str, dict[str, dict[str, float]]]
    date: str
    commit: str


def rate_slices(items: list[WorkItem], rates: int) -> list[list[WorkItem]]:
    """One slice of the workload per rate: no request is sent twice, so no rate finds its
    prompts in the prefix caches that an earlier rate filled."""
    return [[items[i] for i in part] for part in np.array_split(np.arange(len(items)), rates)]


@dataclass
class _Side:
    """A side's servers while the sweep runs."""

    side: PdSide
    engines: list[ServeProcess]
    gateway: ServeProcess
    store: EmbeddedRedis | None

    def names(self) -> dict[str, str]:
        """URL -> the server's name in the report."""
        engines = zip(self.engines, self.side.names(), strict=True)
        return {self.gateway.url: "GATEWAY", **{server.url: name for server, name in engines}}

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Every server's chosen counters now, by its name."""
        return {
            name: counters(url, GATEWAY_COUNTERS if name == "GATEWAY" else ENGINE_COUNTERS)
            for url, name in self.names().items()
        }


def _start_store(stack: contextlib.ExitStack) -> EmbeddedRedis:
    """A fresh Redis Stack for one side's KV store, started, without persistence (the KV
    is scratch)."""
    from cache.redis_server import EmbeddedRedis

    data = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    server = EmbeddedRedis(data, STORE_MAXMEMORY, persistent=False)
    server.start()
    stack.callback(server.stop)
    return server


def _sides(run: SweepRun, stack: contextlib.ExitStack) -> list[_Side]:
    from gateway.serve_process import ServeProcess

    sides = []
    for side in run.sides:
        store = _start_store(stack) if side.kv_store else None
        url = store.url if store is not None else None
        engines = [ServeProcess(run.engine_args(engine, url)) for engine in side.engines]
        gateway = ServeProcess(run.gateway_args(side, [engine.url for engine in engines]))
        sides.append(_Side(side, engines, gateway, store))
    return sides


def _kill_stores(sides: list[_Side], after: float, stack: contextlib.ExitStack) -> None:
    """Kills every side's KV store (SIGKILL: a Redis that dies) `after` seconds from now."""

    def kill() -> None:
        for side in sides:
            if side.store is not None and side.store.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(side.store.pid, signal.SIGKILL)

    timer = threading.Timer(after, kill)
    timer.daemon = True
    timer.start()
    stack.callback(timer.cancel)


def run_sweep(run: SweepRun, options: WorkloadOptions, console: Console) -> SweepResult:
    """Every side at every rate, `options.num_requests` requests each."""
    from gateway.serve_process import serving

    date = utc_now()
    whole = dataclasses.replace(options, num_requests=options.num_requests * len(run.rates))
    with console.status("building the mixed workload ..."):
        slices = rate_slices(build_workload("mixed", whole), len(run.rates))
    labels = [side.label for side in run.sides]
    records: dict[str, dict[float, list[RequestRecord]]] = {label: {} for label in labels}
    elapsed: dict[str, dict[float, float]] = {label: {} for label in labels}
    with contextlib.ExitStack() as stack:
        with console.status("starting the KV stores and the servers ..."):
            sides = _sides(run, stack)
            # The engine servers first: a gateway is ready once one of its servers is.
            stack.enter_context(serving(*(e for side in sides for e in side.engines)))
            stack.enter_context(serving(*(side.gateway for side in sides)))
            endpoints = {
                side.side.label: Endpoint(
                    Endpoint.chat_url(side.gateway.url), run.model, timeout=run.timeout
                )
                for side in sides
            }
            for endpoint in endpoints.values():
                warm_up(endpoint)
        before = {side.side.label: side.snapshot() for side in sides}
        if run.kill_store_after is not None:
            _kill_stores(sides, run.kill_store_after, stack)
        for i, (rate, items) in enumerate(zip(run.rates, slices, strict=True)):
            shape = LoadShape(rate=rate, duration=NO_LIMIT, seed=run.seed + i)
            for label in labels if i % 2 == 0 else labels[::-1]:
                progress = f"{label} at {rate:g} req/s ({i + 1}/{len(run.rates)})"
                result = asyncio.run(run_load(items, endpoints[label], shape, console, progress))
                records[label][rate] = result.records
                elapsed[label][rate] = result.elapsed
        servers = {
            side.side.label: {
                name: counters_between(before[side.side.label][name], after)
                for name, after in side.snapshot().items()
            }
            for side in sides
        }
    settings = {side.label: run.command(side) for side in run.sides}
    return SweepResult(
        settings, options, run.rates, run.seed, records, elapsed, servers, date, git_commit()
    )

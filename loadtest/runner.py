"""The load generator: sends a workload open loop (Poisson arrivals) or closed loop (a fixed
number of requests in flight), bounded by a request count and a duration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from rich.console import Console

from loadtest.client import Endpoint, send
from loadtest.record import RequestRecord
from loadtest.schedule import poisson_arrivals
from loadtest.work_item import WorkItem


@dataclass(frozen=True)
class LoadShape:
    """Exactly one of `rate` (open loop, requests per second) and `concurrency` (closed
    loop). No request is sent after `duration` seconds; those in flight then finish (each
    within the endpoint's timeout)."""

    rate: float | None = None
    concurrency: int | None = None
    duration: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate (open loop) and concurrency (closed loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")

    def describe(self) -> str:
        if self.rate is not None:
            return f"open loop, Poisson arrivals at {self.rate:g} req/s"
        return f"closed loop, {self.concurrency} in flight"


@dataclass
class RunResult:
    records: list[RequestRecord]  # in the order they were sent
    elapsed: float  # seconds from the start to the last answer


class _Run:
    def __init__(
        self,
        items: list[WorkItem],
        endpoint: Endpoint,
        shape: LoadShape,
        on_finish: Callable[[], None],
    ) -> None:
        self.items, self.endpoint, self.shape = items, endpoint, shape
        self.on_finish = on_finish  # called as each request finishes
        self.records: list[RequestRecord] = []
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def one(self, client: httpx.AsyncClient, index: int, at: float) -> None:
        item = self.items[index]
        record = RequestRecord(
            index=index,
            kind=item.kind,
            long=item.long,
            max_tokens=item.max_tokens,
            ignore_eos=self.endpoint.sends_ignore_eos(item),
            sent_at=at,
        )
        self.records.append(record)
        await send(client, self.endpoint, item, record)
        self.on_finish()

    async def drive(self, client: httpx.AsyncClient) -> None:
        await (self.open_loop if self.shape.rate is not None else self.closed_loop)(client)

    async def open_loop(self, client: httpx.AsyncClient) -> None:
        assert self.shape.rate is not None
        arrivals = poisson_arrivals(self.shape.rate, len(self.items), self.shape.seed)
        async with asyncio.TaskGroup() as group:
            for index, at in enumerate(arrivals):
                if at > self.shape.duration:
                    break
                await asyncio.sleep(max(0.0, at - self.now()))
                group.create_task(self.one(client, index, self.now()))

    async def closed_loop(self, client: httpx.AsyncClient) -> None:
        assert self.shape.concurrency is not None
        indices = iter(range(len(self.items)))

        async def worker() -> None:
            for index in indices:  # shared: each index goes to one worker
                at = self.now()
                if at > self.shape.duration:
                    return
                await self.one(client, index, at)

        async with asyncio.TaskGroup() as group:
            for _ in range(self.shape.concurrency):
                group.create_task(worker())


async def run_load(
    items: list[WorkItem],
    endpoint: Endpoint,
    shape: LoadShape,
    console: Console | None = None,
    label: str = "requests",
) -> RunResult:
    """Runs the workload against the endpoint; a progress bar on `console` if given."""
    from bench.report import progress

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(endpoint.timeout, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        if console is None:
            run = _Run(items, endpoint, shape, on_finish=lambda: None)
            await run.drive(client)
        else:
            with progress(console) as bar:
                bar_task = bar.add_task(label, total=len(items))
                run = _Run(items, endpoint, shape, on_finish=lambda: bar.advance(bar_task))
                await run.drive(client)
                bar.update(bar_task, total=len(run.records))  # the duration may cut it short
    finished = [r.finished_at for r in run.records if r.finished_at is not None]
    return RunResult(run.records, max(finished, default=run.now()))

"""Async scheduling (EngineConfig.async_scheduling; vLLM's --async-scheduling, SGLang's
overlap scheduler): the engine keeps one step in flight. Each call schedules step N + 1
and launches it before it processes step N's outputs, so the scheduling of N + 1
overlaps N's forward, and N's update, stop checks and report overlap N + 1's.

The forward runs on the runner's one worker thread: torch runs ops in the calling
thread, so on a CPU the core thread could not do anything else meanwhile. One call:

    schedule(N + 1)            core thread, while N runs on the worker
    wait for N                 its sampled tokens, a tensor and a list
    prepare(N + 1)             core thread: the step buffers (free once N has ended),
                               placeholders read from N's sampled-token tensor
    run(N + 1)                 handed to the worker
    resolve(N), outputs of N   core thread, while N + 1 runs
    advance(N + 1)             placeholders for N + 1's tokens (engine/async_scheduler.py)

Every forward runs on the one worker in launch order, and a step is prepared only once
the one before it has ended: KV blocks a request frees while step N + 1 may still write
them (it finished in N) go to later steps only, which run after N + 1. A request that
ends in N has its N + 1 computed and dropped: never streamed, never counted.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import torch

from engine.async_scheduler import AsyncScheduler
from engine.outputs import CoreOutput
from engine.scheduler import ScheduledSequence, computed_and_prefill

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


class InFlight(NamedTuple):
    scheduled: list[ScheduledSequence]
    tokens: Future[tuple[torch.Tensor, list[int]]]  # ModelRunner.run's


class AsyncSteps:
    """LLMEngine.step with one step in flight."""

    def __init__(self, engine: LLMEngine, scheduler: AsyncScheduler) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.worker = ThreadPoolExecutor(
            1, thread_name_prefix="semgate-forward", initializer=engine.claim_threads
        )
        self.in_flight: InFlight | None = None

    def step(self) -> list[CoreOutput]:
        """One step's outputs: launches the next step, then processes the one in flight
        (a call with none in flight launches one first)."""
        engine, scheduler = self.engine, self.scheduler
        started = time.perf_counter()
        engine.last_step = None
        previous, self.in_flight = self.in_flight, None  # a step that failed is gone too
        if previous is None:
            first = scheduler.schedule()
            if not first:
                return []
            previous = self._launch(first, None)
            scheduler.advance(first)
        scheduled = scheduler.schedule()
        sampled, tokens = previous.tokens.result()
        self.in_flight = self._launch(scheduled, sampled) if scheduled else None
        num_computed, num_prefill = computed_and_prefill(previous.scheduled)
        resolved = scheduler.resolve(previous.scheduled, tokens)
        outputs = engine.outputs(resolved, [])
        engine.record_step(started, num_computed, num_prefill)
        if scheduled:
            scheduler.advance(scheduled)
        return outputs

    def _launch(
        self, scheduled: list[ScheduledSequence], previous: torch.Tensor | None
    ) -> InFlight:
        """Prepares a step (the one before it has ended) and hands it to the worker."""
        prepared = self.engine.runner.prepare(scheduled, previous)
        return InFlight(scheduled, self.worker.submit(self.engine.runner.run, prepared))

    def has_unfinished(self) -> bool:
        return self.in_flight is not None or self.scheduler.has_unfinished()

    def close(self) -> None:
        """Waits for the step in flight, and stops the worker."""
        self.worker.shutdown()

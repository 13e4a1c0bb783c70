"""Async scheduling (EngineConfig.async_scheduling; vLLM's --async-scheduling, SGLang's
overlap scheduler): the engine keeps one step in flight. Each call schedules step N + 1
and launches it before it processes step N's outputs, so the scheduling of N + 1
overlaps N's forward, and N's update, stop checks and report overlap N + 1's.

On a CPU torch runs ops in the calling thread, so the forward runs on the runner's one
worker thread while the core thread does the rest; on CUDA the core thread launches it,
and the GPU runs it while the core thread goes on. One call:

    schedule(N + 1)            core thread, while N runs
    N's sampled-token tensor   CPU: once N has ended (the step buffers, which its
                               forward reads in place, are free then); CUDA: at once
    prepare(N + 1)             core thread: the step buffers, placeholders read from
                               N's sampled-token tensor (on the device)
    run(N + 1)                 handed to the worker (CPU), launched (CUDA)
    resolve(N), outputs of N   core thread, while N + 1 runs; N's tokens on the host
                               first (CUDA: a non-blocking copy, and its event)
    advance(N + 1)             placeholders for N + 1's tokens (engine/async_scheduler.py)

Every forward runs in launch order (one worker thread, or one CUDA stream): KV blocks
a request frees while step N + 1 may still write them (it finished in N) go to later
steps only, which run after N + 1. A request that ends in N has its N + 1 computed and
dropped: never streamed, never counted.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, Protocol

import torch

from engine.async_scheduler import AsyncScheduler
from engine.model_runner import ModelRunner, SampledTokens
from engine.outputs import CoreOutput
from engine.scheduler import ScheduledSequence, computed_and_prefill
from engine.sequence import Sequence
from engine.step_window import StepTime


class SteppedEngine(Protocol):
    """What AsyncSteps needs of the engine that owns it (engine/llm_engine.py's LLMEngine,
    which imports this module)."""

    runner: ModelRunner
    last_step: StepTime | None

    def claim_threads(self) -> None: ...

    def outputs(
        self, sampled: list[tuple[Sequence, int]], outputs: list[CoreOutput]
    ) -> list[CoreOutput]: ...

    def record_step(self, started: float, num_computed: int, num_prefill: int) -> None: ...


class InFlight(NamedTuple):
    scheduled: list[ScheduledSequence]
    sampled: Future[SampledTokens]  # ModelRunner.run's


class AsyncSteps:
    """LLMEngine.step with one step in flight."""

    def __init__(self, engine: SteppedEngine, scheduler: AsyncScheduler) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.worker: ThreadPoolExecutor | None = None
        if engine.runner.device.type == "cpu":
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
        sampled = previous.sampled.result()
        self.in_flight = self._launch(scheduled, sampled.device) if scheduled else None
        num_computed, num_prefill = computed_and_prefill(previous.scheduled)
        resolved = scheduler.resolve(previous.scheduled, sampled.tolist())
        outputs = engine.outputs(resolved, [])
        engine.record_step(started, num_computed, num_prefill)
        if scheduled:
            scheduler.advance(scheduled)
        return outputs

    def _launch(
        self, scheduled: list[ScheduledSequence], previous: torch.Tensor | None
    ) -> InFlight:
        """Prepares a step and hands it to the worker (CPU), or launches it (CUDA)."""
        runner = self.engine.runner
        prepared = runner.prepare(scheduled, previous)
        if self.worker is not None:
            return InFlight(scheduled, self.worker.submit(runner.run, prepared))
        launched: Future[SampledTokens] = Future()
        launched.set_result(runner.run(prepared))
        return InFlight(scheduled, launched)

    def has_unfinished(self) -> bool:
        return self.in_flight is not None or self.scheduler.has_unfinished()

    def close(self) -> None:
        """Waits for the step in flight, and stops the worker."""
        if self.worker is not None:
            self.worker.shutdown()

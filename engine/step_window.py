"""Where the engine's steps went over the last minute: prefill against decode.

A step that computes any prefill chunk (a prompt, or a preempted request's recompute)
counts as a prefill step, its decodes riding along included; a step of decodes and
speculative verifications only counts as a decode step. That is the split an operator
acts on: prefill steps are the ones that stall running streams.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

WINDOW_SECONDS = 60.0


class StepTime(NamedTuple):
    seconds: float  # the whole step: schedule, forward, sampling, update
    prefill_tokens: int  # prompt (or recomputed) tokens it computed
    decode_tokens: int  # the rest: decodes and verified proposals


@dataclass(frozen=True)
class StepWindowStats:
    window_seconds: float  # the time covered: the last minute, or less since start
    prefill_steps: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens: int = 0  # prompt tokens those steps computed
    decode_steps: int = 0
    decode_seconds: float = 0.0
    decode_tokens: int = 0  # tokens computed by decode-only steps (verified drafts included)

    @property
    def busy_fraction(self) -> float:
        """Share of the window spent inside steps (the rest: idle or between steps)."""
        if self.window_seconds <= 0:
            return 0.0
        return min(1.0, (self.prefill_seconds + self.decode_seconds) / self.window_seconds)


class StepWindow:
    """Running sums over the steps that ended in the last `seconds`: O(1) a step. Steps
    are added on one thread and read on another (AsyncLLM's reader and the gateway's
    loop), so both hold a lock; reading expires old steps, so an idle engine reads 0."""

    def __init__(self, seconds: float = WINDOW_SECONDS) -> None:
        self.seconds = seconds
        self.started = time.perf_counter()
        self._lock = threading.Lock()
        self._steps: deque[tuple[float, StepTime]] = deque()  # (when it ended, the step)
        # prefill steps, seconds, tokens; decode steps, seconds, tokens
        self._sums: list[float] = [0, 0.0, 0, 0, 0.0, 0]

    def add(self, step: StepTime) -> None:
        now = time.perf_counter()
        with self._lock:
            self._steps.append((now, step))
            self._count(step, +1)
            self._expire(now)

    def stats(self) -> StepWindowStats:
        now = time.perf_counter()
        with self._lock:
            self._expire(now)
            s = list(self._sums)
        return StepWindowStats(
            window_seconds=min(self.seconds, now - self.started),
            prefill_steps=int(s[0]),
            prefill_seconds=s[1],
            prefill_tokens=int(s[2]),
            decode_steps=int(s[3]),
            decode_seconds=s[4],
            decode_tokens=int(s[5]),
        )

    def _expire(self, now: float) -> None:
        while self._steps and self._steps[0][0] < now - self.seconds:
            self._count(self._steps.popleft()[1], -1)
        if not self._steps:  # no float drift left behind once the window empties
            self._sums = [0, 0.0, 0, 0, 0.0, 0]

    def _count(self, step: StepTime, sign: int) -> None:
        base = 0 if step.prefill_tokens else 3
        self._sums[base] += sign
        self._sums[base + 1] += sign * step.seconds
        self._sums[base + 2] += sign * (step.prefill_tokens or step.decode_tokens)

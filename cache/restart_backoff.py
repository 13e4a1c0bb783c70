"""Restarts with backoff, for the supervisors of what semgate runs: the embedded Redis
(cache/supervisor.py) and the engine core (gateway/upstream/core_supervisor.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class RestartBackoff:
    """Restarts with growing delays (`delays`, the last one repeating), back to the first
    once a run stayed up `stable_seconds`. Each try runs in a thread, which cancelling
    the caller cannot stop: `pending` is the try under way, for a stop() to wait on."""

    def __init__(self, delays: tuple[float, ...], stable_seconds: float) -> None:
        self.delays = delays
        self.stable_seconds = stable_seconds
        self.tries = 0  # since the last run that stayed up stable_seconds
        self.up_since = self.down_since = time.monotonic()
        self.pending: asyncio.Future[Any] | None = None

    def went_down(self) -> None:
        self.down_since = time.monotonic()
        if self.down_since - self.up_since >= self.stable_seconds:
            self.tries = 0

    @property
    def delay(self) -> float:
        """Before the next try."""
        return self.delays[min(self.tries, len(self.delays) - 1)]

    @property
    def down_seconds(self) -> float:
        """How long the last outage lasted, once it is over."""
        return self.up_since - self.down_since

    async def attempt(self, start: Callable[[], T]) -> T:
        """After the delay, `start()` in a thread: what it returns, or raises."""
        await asyncio.sleep(self.delay)
        self.tries += 1
        pending = asyncio.ensure_future(asyncio.to_thread(start))
        self.pending = pending
        try:
            result = await asyncio.shield(pending)
        finally:
            if pending.done():
                self.pending = None
        self.up_since = time.monotonic()
        return result

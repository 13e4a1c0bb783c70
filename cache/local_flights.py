"""Single-flight: concurrent equivalent misses share one upstream call.

The first miss starts a flight: a task that runs the upstream stream and buffers
every chunk. Later misses in the same scope that are equivalent (the same exact
key, or a vector within the threshold that the guard accepts) subscribe to that
flight and receive the same chunks, from the first one, live. The flight belongs
to no single client: it runs while anyone listens, so the leader disconnecting
does not cut off its followers, and it is cancelled (aborting the upstream) only
when the last listener leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from cache.guard import Guard

T = TypeVar("T")


@dataclass(eq=False)
class Flight(Generic[T]):
    scope: Hashable
    exact_key: str
    text: str
    vector: np.ndarray | None
    chunks: list[T] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    listeners: int = 0
    abandoned: bool = False  # every listener left: being cancelled, joinable no more
    task: asyncio.Task[None] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def subscribe(self) -> AsyncGenerator[T, None]:
        """Every chunk from the first; raises the upstream's error if it failed. The
        listener counts from this call, not from its first read, so a leader leaving
        before a follower's first read does not cancel the flight."""
        self.listeners += 1
        return self._follow()

    async def _follow(self) -> AsyncGenerator[T, None]:
        try:
            i = 0
            while True:
                while i < len(self.chunks):
                    yield self.chunks[i]
                    i += 1
                if self.done:
                    if self.error is not None:
                        raise self.error
                    return
                await self._wake.wait()
        finally:
            self.listeners -= 1
            if self.listeners == 0 and not self.done and self.task is not None:
                self.abandoned = True  # before cancel(): no one may join a dying flight
                self.task.cancel()


class SingleFlight(Generic[T]):
    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self._flights: dict[Hashable, list[Flight[T]]] = {}

    def find(
        self,
        scope: Hashable,
        exact_key: str,
        text: str,
        vector: np.ndarray | None,
        threshold: float,
    ) -> Flight[T] | None:
        """A running flight this request may follow, if any."""
        best: Flight[T] | None = None
        best_similarity = -1.0
        for flight in self._flights.get(scope, []):
            if flight.abandoned:
                continue
            if flight.exact_key == exact_key:
                return flight
            if vector is None or flight.vector is None:
                continue
            similarity = float(np.dot(vector, flight.vector))
            if similarity < threshold or similarity <= best_similarity:
                continue
            # On the event loop, the cross-encoder included (15-19 ms when it runs, and
            # only for a similar flight in progress): finding and starting a flight must
            # not yield.
            if not self.guard.check(flight.text, text, similarity).ok:
                continue
            best, best_similarity = flight, similarity
        return best

    def start(
        self,
        scope: Hashable,
        exact_key: str,
        text: str,
        vector: np.ndarray | None,
        produce: Callable[[], AsyncGenerator[T, None]],
    ) -> Flight[T]:
        """Starts a flight running `produce` (which should also store the answer, so the
        flight is only unregistered once later requests can hit the cache instead)."""
        flight: Flight[T] = Flight(scope, exact_key, text, vector)
        self._flights.setdefault(scope, []).append(flight)
        flight.task = asyncio.get_running_loop().create_task(self._run(flight, produce))
        # Unregister when the task ends, however it ends (even cancelled before it ran).
        flight.task.add_done_callback(lambda _: self._end(flight))
        return flight

    def _end(self, flight: Flight[T]) -> None:
        if not flight.done:  # cancelled before _run's first step
            flight.done = True
            flight.error = RuntimeError("upstream cancelled: every listener left")
        flights = self._flights.get(flight.scope, [])
        if flight in flights:
            flights.remove(flight)
        if not flights:
            self._flights.pop(flight.scope, None)
        flight._notify()

    async def _run(self, flight: Flight[T], produce: Callable[[], AsyncGenerator[T, None]]) -> None:
        stream = produce()
        try:
            async for chunk in stream:
                flight.chunks.append(chunk)
                flight._notify()
        except asyncio.CancelledError:
            flight.error = RuntimeError("upstream cancelled: every listener left")
        except Exception as exc:
            flight.error = exc
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
            flight.done = True
            flight._notify()

    def in_flight(self) -> int:
        return sum(len(f) for f in self._flights.values())

"""Flights in this process: concurrent equivalent misses share one upstream answer.

A flight is registered by the first miss (its leader), which then feeds it the answer's
stream. Later misses in the same scope that are equivalent (the same exact key, or a
vector within the threshold that the guard accepts) subscribe to it and receive the same
chunks, from the first one, live. A fed flight belongs to no single client: it runs while
anyone listens, so the leader disconnecting does not cut off its followers, and it is
cancelled (closing its source, which aborts the upstream) only when the last listener
leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from cache.guard import Guard

T = TypeVar("T")

EVERYONE_LEFT = "upstream cancelled: every listener left"


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
    _flights: LocalFlights[T] | None = None

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def subscribe(self) -> AsyncGenerator[T, None]:
        """Every chunk from the first; raises the upstream's error if it failed. The
        listener counts from this call, not from its first read, so a leader leaving
        before a follower's first read does not cancel the flight."""
        self.listeners += 1
        return self._follow()

    def feed(self, source: AsyncIterator[T]) -> None:
        """Runs `source` as the flight's answer (it should also store the answer, so the
        flight is only unregistered once later requests can hit the cache instead)."""
        assert self.task is None, "a flight is fed once"
        self.task = asyncio.get_running_loop().create_task(self._run(source))
        # Unregister when the task ends, however it ends (even cancelled before it ran).
        self.task.add_done_callback(lambda _: self._end(RuntimeError(EVERYONE_LEFT)))

    def fail(self, error: BaseException) -> None:
        """Ends a flight that will never be fed: its listeners get `error`."""
        self._end(error)

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
            if self.listeners == 0 and not self.done:
                self.abandoned = True  # before cancel(): no one may join a dying flight
                if self.task is not None:
                    self.task.cancel()
                else:  # never fed: nothing runs that could end it
                    self._end(RuntimeError(EVERYONE_LEFT))

    async def _run(self, source: AsyncIterator[T]) -> None:
        try:
            async for chunk in source:
                self.chunks.append(chunk)
                self._notify()
        except asyncio.CancelledError:
            self.error = RuntimeError(EVERYONE_LEFT)
        except Exception as exc:
            self.error = exc
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
            self.done = True
            self._notify()

    def _end(self, error: BaseException) -> None:
        """Unregisters the flight; one that never finished ends with `error`."""
        if not self.done:
            self.done = True
            self.error = error
        if self._flights is not None:
            self._flights.unregister(self)
            self._flights = None
        self._notify()


class LocalFlights(Generic[T]):
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
            # On the event loop, the cross-encoder included (~4.5 ms in int8 when it runs, and
            # only for a similar flight in progress): finding and starting a flight must
            # not yield.
            if not self.guard.check(flight.text, text, similarity).ok:
                continue
            best, best_similarity = flight, similarity
        return best

    def start(
        self, scope: Hashable, exact_key: str, text: str, vector: np.ndarray | None
    ) -> Flight[T]:
        """Registers a flight for its leader to feed; equivalent misses find it at once."""
        flight: Flight[T] = Flight(scope, exact_key, text, vector, _flights=self)
        self._flights.setdefault(scope, []).append(flight)
        return flight

    def unregister(self, flight: Flight[T]) -> None:
        flights = self._flights.get(flight.scope, [])
        if flight in flights:
            flights.remove(flight)
        if not flights:
            self._flights.pop(flight.scope, None)

    def in_flight(self) -> int:
        return sum(len(f) for f in self._flights.values())

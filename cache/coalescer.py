"""Coalescing: concurrent equivalent misses share one upstream answer, in this process
(cache/local_flights.py) and, given a codec, across replicas sharing one Redis
(cache/shared_flights.py).

`Coalescer.join` gives a missed request its `Seat`: it follows a flight already in
progress, or it feeds a new one. A seat that feeds is given the stream by its caller:
the upstream's answer when it leads, or, when another replica leads, that replica's
answer (`Seat.remote`) relayed to this process's followers. The coalescer never starts
an upstream request itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from cache.guard import Guard
from cache.local_flights import Flight, LocalFlights
from cache.lookup_result import LookupResult
from cache.shared_flights import Claim, Codec, FlightLost, SharedFlights
from cache.stats import CacheStats

T = TypeVar("T")


@dataclass(eq=False)
class Seat(Generic[T]):
    """A missed request's place. A seat that `feeds` runs the flight's source, given
    once, at once (`feed`): the upstream's answer when the request leads, or `remote`
    (another replica's answer, decoded, which ends with FlightLost if that replica stops)
    when this process follows another; else it follows a flight of this process
    (`answer`)."""

    feeds: bool
    remote: AsyncGenerator[T, None] | None = None
    _flight: Flight[T] | None = None
    _stream: AsyncGenerator[T, None] | None = None
    # Given when this process leads a flight shared through Redis: the source, published.
    _publish: Callable[[AsyncIterator[T]], AsyncIterator[T]] | None = None

    def feed(self, source: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """Runs `source` as the flight's answer (published for other replicas when this
        process leads a shared flight) and returns this request's own stream of it."""
        assert self.feeds, "only a seat without a source is fed"
        if self._flight is None:  # nothing to share: the request's own answer
            return source
        self._flight.feed(source if self._publish is None else self._publish(source))
        assert self._stream is not None
        return self._stream

    def answer(self) -> AsyncGenerator[T, None]:
        """A follower's stream of the flight it joined."""
        assert not self.feeds and self._stream is not None
        return self._stream


class Coalescer(Generic[T]):
    def __init__(self, guard: Guard, shared: SharedFlights, stats: CacheStats) -> None:
        self.local: LocalFlights[T] = LocalFlights(guard)
        self.shared = shared
        self.stats = stats

    async def join(
        self, lookup: LookupResult, variant: Hashable = None, codec: Codec | None = None
    ) -> Seat[T]:
        """Joins an equivalent flight in progress, or starts one for this request to
        feed. Only flights of the same `variant` are joined: callers put there what
        shapes the answer beyond the question (a length limit, stop sequences), so no one
        follows an answer cut shorter than their own would be. With a `codec` (encode,
        decode of a chunk), flights are shared with other processes over Redis too, for
        the same exact question and variant."""
        scope, question, exact_key = lookup.scope, lookup.question, lookup.exact_key
        if scope is None or question is None or exact_key is None:
            return Seat(feeds=True)
        key = (scope, variant)
        found: Flight[T] | None = self.local.find(
            key, exact_key, question, lookup.vector, lookup.threshold
        )
        if found is not None:
            self.stats.coalesced += 1
            return Seat(feeds=False, _stream=found.subscribe())
        # Registered before the claim's round trip, so that equivalent requests in this
        # process join it instead of claiming again.
        flight: Flight[T] = self.local.start(key, exact_key, question, lookup.vector)
        stream = flight.subscribe()
        if codec is None:
            return Seat(feeds=True, _flight=flight, _stream=stream)
        try:
            claim = await self.shared.claim(SharedFlights.flight_id(exact_key, variant))
        except BaseException as exc:  # cancelled: no one will feed the flight
            flight.fail(exc)
            raise
        encode, decode = codec
        if claim.leader:
            # A failed claim (Redis down) leads alone: nothing to publish.
            publish = partial(self.shared.publish, claim, encode=encode) if claim.shared else None
            return Seat(feeds=True, _flight=flight, _stream=stream, _publish=publish)
        self.stats.coalesced += 1
        self.stats.coalesced_remote += 1
        remote = self._follow(claim, decode)
        return Seat(feeds=True, remote=remote, _flight=flight, _stream=stream)

    async def _follow(
        self, claim: Claim, decode: Callable[[bytes], Any]
    ) -> AsyncGenerator[T, None]:
        """Another replica's flight, decoded; its loss is counted, then raised."""
        try:
            async for payload in self.shared.follow(claim):
                yield decode(payload)
        except FlightLost:
            self.stats.errors["flight_lost"] += 1
            raise

    def in_flight(self) -> int:
        return self.local.in_flight()

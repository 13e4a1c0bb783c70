"""Flights shared across processes through the session's real Redis Stack. Each
"process" is its own SemanticCache over its own CacheStore connection: separate local
flights, so only Redis can coalesce them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from cache import EmbeddedRedis, Embedder, SemanticCache
from cache.redis_server import free_port
from cache.shared_flights import FlightError, FlightLost, SharedFlights
from cache.store import CacheStore
from gateway.chat_service import relayed
from tests.cache.fixtures import Run, ask

CODEC = (str.encode, bytes.decode)
PIECES = ["Open ", "Settings, ", "then ", "Export, ", "then ", "CSV."]
ANSWER = "".join(PIECES)


class Upstream:
    """A slow upstream that counts its calls and notes when each chunk left it."""

    def __init__(self, fail_after: int | None = None, first_delay: float = 0.0) -> None:
        self.calls = 0
        self.sent = 0
        # Set, the last chunk goes out only once it is: a follower that gets chunks
        # before the end then proves it follows live (or the test hangs and fails).
        self.last_chunk_gate: asyncio.Event | None = None
        self.fail_after = fail_after
        self.first_delay = first_delay

    async def __call__(self) -> AsyncIterator[str]:
        self.calls += 1
        await asyncio.sleep(self.first_delay)
        for i, piece in enumerate(PIECES):
            if i == self.fail_after:
                raise RuntimeError("engine exploded")
            await asyncio.sleep(0.04)
            if i == len(PIECES) - 1 and self.last_chunk_gate is not None:
                await self.last_chunk_gate.wait()
            self.sent += 1
            yield piece


def _flights(client: Any, **kw: Any) -> SharedFlights:
    return SharedFlights(client, **{"poll": 0.1, **kw})


@pytest.fixture
def replicas(
    redis_server: EmbeddedRedis, embedder: Embedder, store: CacheStore, run: Run
) -> Iterator[list[SemanticCache]]:
    """Two gateway replicas over one Redis (the index exists: `store` made it)."""
    stores = [
        CacheStore(redis_server.url, embedder.model_id, embedder.dims, "semgate-test")
        for _ in range(2)
    ]
    yield [SemanticCache(s, embedder, shared_flights=_flights(s.client)) for s in stores]
    for s in stores:
        run(s.close())


async def _start(
    cache: SemanticCache, question: str, tenant: str, upstream: Any, variant: Any = None
) -> tuple[bool, AsyncIterator[str]]:
    """Whether the request leads, and its answer, as the chat service joins a flight:
    another replica's answer is relayed (its own upstream's, if that one is lost before
    its first chunk)."""
    lookup = await cache.lookup(ask(question, tenant))
    assert lookup.status in ("miss", "error")
    seat = await cache.coalescer.join(lookup, variant, CODEC)
    if not seat.feeds:
        return False, seat.answer()
    if seat.remote is not None:
        return False, seat.feed(relayed(seat.remote, upstream))
    return True, seat.feed(upstream())


async def _start_each(
    caches: list[SemanticCache], question: str, tenant: str, upstream: Any
) -> list[tuple[bool, AsyncIterator[str]]]:
    """`_start` on each cache in turn, with the same question."""
    return [await _start(cache, question, tenant, upstream) for cache in caches]


async def _drain(stream: AsyncIterator[str], first: asyncio.Event | None = None) -> list[str]:
    """Every piece; sets `first` once the first has arrived."""
    pieces = []
    async for piece in stream:
        pieces.append(piece)
        if first is not None:
            first.set()
    return pieces


def test_follower_in_another_process_streams_live(
    replicas: list[SemanticCache], tenant: str, run: Run
):
    a, b = replicas
    upstream = Upstream()

    async def scenario():
        (lead_a, stream_a), (lead_b, stream_b) = await _start_each(
            replicas, "How do I export contacts?", tenant, upstream
        )
        upstream.last_chunk_gate = asyncio.Event()
        got_a, got_b = await asyncio.gather(
            _drain(stream_a), _drain(stream_b, first=upstream.last_chunk_gate)
        )
        return lead_a, lead_b, got_a, got_b

    lead_a, lead_b, got_a, got_b = run(scenario())
    assert (lead_a, lead_b, upstream.calls) == (True, False, 1)
    assert got_a == got_b == PIECES  # and b got its first piece before the last was sent
    assert (a.stats.coalesced, b.stats.coalesced, b.stats.coalesced_remote) == (0, 1, 1)
    assert b.stats.snapshot()["coalesced_remote"] == 1

    async def keys_after():
        lookup = await a.lookup(ask("How do I export contacts?", tenant))
        assert lookup.scope is not None
        flight_id = SharedFlights.flight_id(lookup.exact_key or "")
        return await a.store.client.keys(f"semgate:flight:{{{flight_id}}}:*")

    keys = run(keys_after())  # the lock is released, the ended stream lingers a while
    assert len(keys) == 1 and not keys[0].endswith(b":lock")
    assert 0 < run(a.store.client.pttl(keys[0])) <= 30_000
    # A finished flight is never joined (nor its lingering stream replayed): the next
    # request leads a flight of its own.
    leader, stream = run(_start(b, "How do I export contacts?", tenant, upstream))
    assert leader and run(_drain(stream)) and upstream.calls == 2


def test_a_slow_first_chunk_is_not_a_dead_leader(
    replicas: list[SemanticCache], tenant: str, run: Run
):
    """The leader's heartbeat keeps its lease while the upstream has nothing to send."""
    for cache in replicas:
        cache.coalescer.shared = _flights(cache.store.client, lease=0.3)
    _, b = replicas
    upstream = Upstream(first_delay=0.8)

    async def scenario():
        (_, stream_a), (lead_b, stream_b) = await _start_each(
            replicas, "Explain our SLA", tenant, upstream
        )
        got = await asyncio.gather(_drain(stream_a), _drain(stream_b))
        return lead_b, got

    lead_b, (got_a, got_b) = run(scenario())
    assert not lead_b and upstream.calls == 1 and got_a == got_b == PIECES
    assert b.stats.errors["flight_lost"] == 0


def test_late_follower_replays_from_the_first_chunk(
    replicas: list[SemanticCache], tenant: str, run: Run
):
    a, b = replicas
    upstream = Upstream()

    async def scenario():
        _, stream_a = await _start(a, "Which plan has SSO?", tenant, upstream)
        early = [await anext(stream_a) for _ in range(3)]
        lead_b, stream_b = await _start(b, "Which plan has SSO?", tenant, upstream)
        rest_a, got_b = await asyncio.gather(_drain(stream_a), _drain(stream_b))
        return lead_b, early + rest_a, got_b

    lead_b, got_a, got_b = run(scenario())
    assert not lead_b and upstream.calls == 1 and got_a == got_b == PIECES


def test_the_leaders_error_reaches_the_follower(
    replicas: list[SemanticCache], tenant: str, run: Run
):
    upstream = Upstream(fail_after=2)

    async def drain(stream: AsyncIterator[str]) -> tuple[list[str], BaseException | None]:
        got: list[str] = []
        try:
            async for piece in stream:
                got.append(piece)
        except Exception as exc:
            return got, exc
        return got, None

    async def scenario():
        started = await _start_each(replicas, "Why is the sky blue?", tenant, upstream)
        return await asyncio.gather(*(drain(stream) for _, stream in started))

    (got_a, err_a), (got_b, err_b) = run(scenario())
    assert upstream.calls == 1 and got_a == got_b == PIECES[:2]
    assert isinstance(err_a, RuntimeError) and str(err_a) == "engine exploded"
    assert isinstance(err_b, FlightError) and str(err_b) == "engine exploded"


def test_leader_whose_clients_all_leave_ends_the_flight_as_lost(
    replicas: list[SemanticCache], tenant: str, run: Run
):
    """Remote followers do not keep another process's flight alive: once they have
    chunks, the loss is their stream's error (before any, they would answer themselves)."""
    upstream = Upstream()

    async def scenario():
        (_, stream_a), (_, stream_b) = await _start_each(
            replicas, "Where is my invoice?", tenant, upstream
        )
        got_b = [await anext(stream_a), await anext(stream_b)][1:]
        await stream_a.aclose()  # the leader's only client disconnects
        with pytest.raises(FlightLost, match="every listener"):
            async for piece in stream_b:
                got_b.append(piece)
        return got_b

    got_b = run(scenario())
    assert upstream.calls == 1 and got_b == PIECES[: len(got_b)] and len(got_b) < len(PIECES)
    assert upstream.sent < len(PIECES)  # the leader's upstream was aborted


@pytest.mark.parametrize(
    "ghost_lease, stall", [(0.3, None), (10.0, 0.3)], ids=["lease-runs-out", "stall"]
)
def test_follower_of_a_vanished_leader_answers_itself(
    replicas: list[SemanticCache], tenant: str, run: Run, ghost_lease: float, stall: float | None
):
    """A leader that claimed and then died (never publishes, never renews its lease) or
    went silent: the follower falls back to its own upstream call."""
    _, b = replicas
    b.coalescer.shared = _flights(b.store.client, stall=stall)
    ghost = _flights(b.store.client, lease=ghost_lease)
    upstream = Upstream()
    question = "How do I reset my password?"

    async def scenario():
        lookup = await b.lookup(ask(question, tenant))
        assert lookup.scope is not None
        flight_id = SharedFlights.flight_id(lookup.exact_key or "")
        assert (await ghost.claim(flight_id)).leader
        leader, stream = await _start(b, question, tenant, upstream)
        return leader, [p async for p in stream]

    # A hang guard, not a timing bound: without the fallback the follower would wait on.
    leader, got = run(scenario(), timeout=10)
    assert not leader and got == PIECES and upstream.calls == 1
    assert b.stats.errors["flight_lost"] == 1


def test_redis_unavailable_fails_open(embedder: Embedder, run: Run, tenant: str):
    port = free_port()  # nothing listens there
    stores = [
        CacheStore(f"redis://127.0.0.1:{port}", embedder.model_id, embedder.dims) for _ in range(2)
    ]
    a, b = (SemanticCache(s, embedder, shared_flights=_flights(s.client)) for s in stores)
    upstream = Upstream()

    async def scenario():
        claim = await a.coalescer.shared.claim("some-flight")
        assert claim.leader and not claim.shared
        streams = await _start_each([a, b], "What is 2 plus 2?", tenant, upstream)
        return [(lead, [p async for p in stream]) for lead, stream in streams]

    try:
        assert run(scenario()) == [(True, PIECES), (True, PIECES)]
        assert upstream.calls == 2
    finally:
        for s in stores:
            run(s.close())


def test_different_variants_never_join(replicas: list[SemanticCache], tenant: str, run: Run):
    a, b = replicas
    upstream = Upstream()

    async def scenario():
        q = "Summarise the refund policy"
        starts = [
            await _start(a, q, tenant, upstream, variant=(16, ())),
            await _start(b, q, tenant, upstream, variant=(32, ())),
            await _start(b, q, tenant, upstream, variant=(16, ())),
        ]
        texts = await asyncio.gather(*(_drain(stream) for _, stream in starts))
        return [lead for lead, _ in starts], texts

    leaders, texts = run(scenario())
    assert leaders == [True, True, False] and upstream.calls == 2
    assert all(t == PIECES for t in texts)


def test_crowds_in_two_processes_share_one_upstream_call(
    replicas: list[SemanticCache], tenant: str, run: Run
):
    """Within a process requests join its local flight (one claim per process); across
    processes the exact same question joins through Redis."""
    a, b = replicas
    upstream = Upstream()

    async def one(cache: SemanticCache) -> tuple[bool, str]:
        leader, stream = await _start(cache, "How do I export my data?", tenant, upstream)
        return leader, "".join([p async for p in stream])

    async def crowd():
        return await asyncio.gather(*(one(c) for c in [a, b] * 10))

    results = run(crowd())
    assert upstream.calls == 1 and {text for _, text in results} == {ANSWER}
    assert sum(leader for leader, _ in results) == 1
    assert a.stats.coalesced + b.stats.coalesced == 19
    assert a.stats.coalesced_remote + b.stats.coalesced_remote == 1
    assert a.coalescer.in_flight() == b.coalescer.in_flight() == 0

"""The balancer among real engine servers (two `semgate serve --no-cache` processes): a prompt
start goes back to the server that prefilled it, whose own prefix cache then serves it;
a loaded server is passed over past the balance threshold; a session stays on its
server; a killed server costs only what it held, its prompt starts move, and it gets
traffic again once it is back."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from gateway.upstream.balancer import BalancerConfig
from gateway.upstream.base import CompletionJob, Delta, UpstreamError
from gateway.upstream.http import HttpUpstream
from tests.gateway.conftest import up
from tests.gateway.servers import MODEL, Server, metric
from tests.waiting import until_async

pytestmark = pytest.mark.slow  # starts a second engine server

PASSAGE = (
    "The lighthouse keeper logged the weather every hour: wind, swell, visibility and "
    "the ships that passed. Over forty years the logbooks filled a whole room. "
)


def context() -> str:
    """A prompt start of its own (about 250 tokens), new to every server."""
    return f"Notes {uuid.uuid4()}.\n" + PASSAGE * 6


@contextlib.asynccontextmanager
async def pool(servers: list[Server], **kwargs: Any) -> AsyncIterator[HttpUpstream]:
    # Health checks only where a test asks: routing then sees no load but its own.
    upstream = HttpUpstream([s.url for s in servers], **{"health_interval": 60.0, **kwargs})
    await upstream.start()
    try:
        yield upstream
    finally:
        await upstream.close()


def job(prompt: str, max_tokens: int = 2, **kw: Any) -> CompletionJob:
    messages = [{"role": "user", "content": prompt}]
    return CompletionJob(request_id=str(uuid.uuid4()), model=MODEL, messages=messages,
                   max_tokens=max_tokens, temperature=0.0, **kw)  # fmt: skip


async def served(upstream: HttpUpstream, prompt: str, **kw: Any) -> str:
    """The server that answered `prompt` (the first delta names it)."""
    deltas = [d async for d in upstream.stream(job(prompt, **kw))]
    assert deltas[-1].finish_reason is not None
    assert deltas[0].upstream is not None
    return deltas[0].upstream


async def held(upstream: HttpUpstream, prompt: str) -> tuple[AsyncGenerator[Delta, None], str]:
    """A long answer started and left running: its server has it in flight."""
    stream = upstream.stream(job(prompt, max_tokens=200, ignore_eos=True))
    first = await anext(stream)
    assert first.upstream is not None
    return stream, first.upstream


def reasons(upstream: HttpUpstream) -> dict[str, dict[str, int]]:
    return {h.name: dict(h.requests) for h in upstream.health()}


def test_a_prompt_start_goes_back_to_its_server_and_hits_its_prefix_cache(engine_pair):
    by_url = {s.url: s for s in engine_pair}
    first, second = context(), context()

    async def main() -> tuple[list[str], list[str], dict[str, dict[str, int]]]:
        async with pool(engine_pair) as upstream:
            a = [await served(upstream, first + "Who kept the logs?")]
            b = [await served(upstream, second + "Who kept the logs?")]
            hits = {url: metric(server, "semgate_prefix_cache_hits_total")
                    for url, server in by_url.items()}  # fmt: skip
            for question in ("How long?", "What was logged?", "Where were the books?"):
                a.append(await served(upstream, first + question))
                b.append(await served(upstream, second + question))
            for url, server in by_url.items():
                # Three questions, each a cached start of about 250 tokens, on each server.
                assert metric(server, "semgate_prefix_cache_hits_total") - hits[url] >= 3 * 192
            return a, b, reasons(upstream)

    a, b, counts = asyncio.run(main())
    assert len(set(a)) == len(set(b)) == 1
    assert a[0] != b[0]  # a start nobody was sent goes to the emptier server
    assert counts == {a[0]: {"fallback": 1, "prefix": 3}, b[0]: {"fallback": 1, "prefix": 3}}


def test_a_loaded_server_is_passed_over_past_the_balance_threshold(engine_pair):
    shared = context()

    async def main() -> None:
        async with pool(engine_pair, balancer=BalancerConfig(balance_threshold=1)) as upstream:
            one, home = await held(upstream, shared + "Tell the story.")
            two, again = await held(upstream, shared + "Tell another story.")
            assert again == home  # 1 more in flight than the other: within the threshold
            assert {h.name: h.in_flight for h in upstream.health()}[home] == 2
            elsewhere = await served(upstream, shared + "Who kept the logs?")
            assert elsewhere != home  # 2 more: past it
            assert reasons(upstream)[elsewhere] == {"load": 1}
            for stream in (one, two):
                await stream.aclose()
            assert [h.in_flight for h in upstream.health()] == [0, 0]
            # Both hold the start now: the less loaded of the two answers it.
            three, busy = await held(upstream, shared + "One more story.")
            assert await served(upstream, shared + "What was logged?") != busy
            await three.aclose()

    asyncio.run(main())


def test_a_session_stays_on_its_server(engine_pair):
    async def main() -> tuple[set[str], set[str]]:
        async with pool(engine_pair, balancer=BalancerConfig(policy="round_robin")) as upstream:
            turns = {await served(upstream, f"Turn {i}: hello.", session="conv-1")
                     for i in range(4)}  # fmt: skip
            plain = {await served(upstream, f"Turn {i}: hello.") for i in range(2)}
            assert sum(h.requests.get("session", 0) for h in upstream.health()) == 3
            return turns, plain

    turns, plain = asyncio.run(main())
    assert len(turns) == 1
    assert len(plain) == 2  # without a session, round robin takes turns


def test_a_killed_server_costs_what_it_held_and_gets_traffic_again_when_back(engine_pair):
    by_url = {s.url: s for s in engine_pair}
    start, later = context(), context()

    async def main() -> None:
        async with pool(engine_pair, health_interval=0.5) as upstream:
            stream, victim = await held(upstream, start + "Tell the story.")
            survivor = next(url for url in by_url if url != victim)
            by_url[victim].stop(signal.SIGKILL)
            with pytest.raises(UpstreamError) as info:  # what it held is lost
                async for _ in stream:
                    pass
            assert info.value.status == 502
            # Its prompt start moves to the survivor, and stays there.
            assert await served(upstream, start + "Who kept the logs?") == survivor
            assert await served(upstream, start + "How long?") == survivor
            await asyncio.to_thread(up, by_url[victim])
            await until_async("it is back", lambda: all(h.up for h in upstream.health()))
            # Back, with an empty cache: a new prompt start goes to it.
            assert await served(upstream, later + "Who kept the logs?") == victim
            assert await served(upstream, start + "What was logged?") == survivor

    asyncio.run(main())

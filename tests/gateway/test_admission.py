"""What one client sends never freezes the others, and the engine admits what
--max-num-seqs and --max-waiting say: on the session's bounded gateway (cache on, 8
running slots and 4 places in the queue: tests/gateway/conftest.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.gateway.conftest import ADMISSION_KEY, MAX_NUM_SEQS, MAX_WAITING, chat_body
from tests.gateway.servers import Server, metric, value_in, wait_for_idle_engine

pytestmark = pytest.mark.slow  # its gateway is started for it (and test_openapi.py)

HEADERS = {"Authorization": f"Bearer {ADMISSION_KEY}"}
CAPACITY = MAX_NUM_SEQS + MAX_WAITING
# The reproduction: a body just under the 4 MiB limit, about 818,000 tokens.
HUGE = "word " * 817_889


@pytest.fixture
def server(bounded_gateway: Server) -> Server:
    return bounded_gateway


async def _poll(client: httpx.AsyncClient, path: str, stop: asyncio.Event) -> int:
    """Asks for `path` until `stop` is set: how many times it was answered (each a 200)."""
    answered = 0
    while not stop.is_set():
        assert (await client.get(path)).status_code == 200
        answered += 1
        await asyncio.sleep(0.01)
    return answered


async def _stream(client: httpx.AsyncClient, started: asyncio.Event) -> list[str]:
    """A streamed answer's data lines; `started` once ten have come."""
    body = chat_body("Tell me a long story.", max_tokens=120, stream=True, ignore_eos=True)
    lines: list[str] = []
    headers = HEADERS | {"Cache-Control": "no-store"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                lines.append(line)
            if len(lines) == 10:
                started.set()
    return lines


async def _huge_beside_a_stream(url: str) -> tuple[list[httpx.Response], int, list[str]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        stop, started = asyncio.Event(), asyncio.Event()
        health = asyncio.create_task(_poll(client, "/health", stop))
        stream = asyncio.create_task(_stream(client, started))
        await started.wait()
        # Encoded once: four json.dumps of 4 MB would stall this client's own loop.
        body = json.dumps(chat_body(HUGE, max_tokens=16)).encode()
        headers = HEADERS | {"content-type": "application/json"}
        huge = await asyncio.gather(
            *[client.post("/v1/chat/completions", content=body, headers=headers) for _ in range(4)]
        )
        lines = await stream
        stop.set()
        return huge, await health, lines


def test_huge_prompts_are_refused_by_their_length_while_others_are_served(server: Server):
    """Four bodies of ~818,000 tokens at once, while another client streams and a probe
    polls /health. They used to be tokenized (and normalized for the cache key) on the
    event loop: /health took 2-10 s and the stream stopped as long. Now they are refused
    by a bound from their length alone, before the tokenizer or the cache sees them (the
    message's "at least"), and the stream and the probe are answered throughout. How
    long /health waits meanwhile is a benchmark's (`semgate bench faults`), not a test's."""
    huge, polls, lines = asyncio.run(_huge_beside_a_stream(server.url))
    for response in huge:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert error["param"] == "messages"
        assert "(at least " in error["message"], error["message"]
    assert polls > 0
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
    choices = [c for line in lines[:-1] for c in json.loads(line[6:])["choices"]]
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["length"]  # whole


async def _burst(url: str, n: int) -> tuple[list[httpx.Response], list[float]]:
    limits = httpx.Limits(max_connections=n + 1)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        held: list[float] = []  # requests in the engine, running or waiting, at each scrape
        stop, scraped = asyncio.Event(), asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                text = (await client.get("/metrics")).text
                held.append(
                    value_in(text, "semgate_num_requests_running")
                    + value_in(text, "semgate_num_requests_waiting")
                )
                scraped.set()
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        await scraped.wait()  # a first scrape before the burst
        headers = HEADERS | {"Cache-Control": "no-store"}
        responses = await asyncio.gather(
            *[
                client.post(
                    "/v1/chat/completions",
                    json=chat_body(f"Name a prime number above {i * 100}.", max_tokens=8),
                    headers=headers,
                )
                for i in range(n)
            ]
        )
        stop.set()
        await watcher
        return responses, held


def test_a_burst_within_capacity_is_admitted_whole(server: Server):
    """As many requests at once as there are running slots and queue places: none is
    refused. Admission used to count requests as queued until the engine reported them
    running, a step or more later, so a burst of 300 got 29 429s with 320 places."""
    responses, held = asyncio.run(_burst(server.url, CAPACITY))
    assert [r.status_code for r in responses] == [200] * CAPACITY, [r.text for r in responses]
    assert max(held) <= CAPACITY, held


def test_the_engine_never_holds_more_than_its_capacity(server: Server):
    """40 requests at once: 12 places (8 slots, 4 in the queue); the rest are refused at
    once (429, Retry-After) instead of waiting without bound. --max-waiting 16 used to
    admit 80 requests, 73 of them waiting."""
    responses, held = asyncio.run(_burst(server.url, 40))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= CAPACITY
    refused = [r for r in responses if r.status_code == 429]
    assert refused, "a burst over three times the capacity was admitted whole"
    assert refused[0].headers["retry-after"] == "1"
    assert refused[0].json()["error"]["code"] == "engine_overloaded"
    assert held and max(held) <= CAPACITY, held
    wait_for_idle_engine(server)
    assert metric(server, "semgate_num_requests_waiting") == 0

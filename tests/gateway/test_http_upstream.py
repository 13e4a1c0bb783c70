"""HttpUpstream against real engine servers (`semgate serve --no-cache` subprocesses)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.upstream.balancer import BalancerConfig
from gateway.upstream.base import CompletionJob, Delta, UpstreamError
from gateway.upstream.http import HttpUpstream
from tests.engine.prompts import CAPITAL_QUESTION
from tests.gateway.conftest import MAX_MODEL_LEN
from tests.gateway.servers import MODEL, Server, free_port, metric
from tests.waiting import until_async

pytestmark = pytest.mark.slow  # starts a server of its own
ROUND_ROBIN = BalancerConfig(policy="round_robin")  # the same prompt to each in turn


@pytest.fixture(scope="module")
def servers(engine_pair: list[Server]) -> list[Server]:
    """The session's engine server and one that speculates (n-gram lookup): lossless,
    so both must give the same greedy answers."""
    return engine_pair


@contextlib.asynccontextmanager
async def pool(urls: list[str], **kwargs: Any) -> AsyncIterator[HttpUpstream]:
    upstream = HttpUpstream(urls, **kwargs)
    await upstream.start()
    try:
        yield upstream
    finally:
        await upstream.close()


def job(upstream: HttpUpstream, question: str = CAPITAL_QUESTION, **kw) -> CompletionJob:
    params = {"max_tokens": 16, "temperature": 0.0, **kw}
    messages = [{"role": "user", "content": question}]
    return CompletionJob(request_id="t", model=upstream.models()[0], messages=messages, **params)


async def collect(upstream: HttpUpstream, chat: CompletionJob) -> list[Delta]:
    return [delta async for delta in upstream.stream(chat)]


def answer(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def check_complete(deltas: list[Delta]) -> None:
    """Text deltas, then exactly one final delta with finish_reason and usage."""
    assert [d.finish_reason is not None for d in deltas].count(True) == 1
    final = deltas[-1]
    assert final.finish_reason in ("stop", "length")
    assert final.prompt_tokens and final.prompt_tokens > 5
    assert final.completion_tokens and 0 < final.completion_tokens <= 16
    assert answer(deltas).strip()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def answered_by(caplog: pytest.LogCaptureFixture) -> list[int]:
    """Ports that got a chat request, from httpx's own request log."""
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    found = (re.search(r"POST http://127\.0\.0\.1:(\d+)/v1/chat/completions", m) for m in lines)
    return [int(m.group(1)) for m in found if m]


def test_streams_deltas_then_one_final_delta_with_usage(servers):
    async def main() -> list[Delta]:
        async with pool([servers[0].url]) as upstream:
            assert upstream.ready()
            assert upstream.gauges() is None
            return await collect(upstream, job(upstream))

    deltas = asyncio.run(main())
    check_complete(deltas)
    assert len(deltas) > 3  # passed through token by token, not in one piece
    assert "Paris" in answer(deltas)


def test_greedy_answers_match_and_round_robin_uses_both(servers, caplog):
    caplog.set_level(logging.INFO, logger="httpx")

    async def main() -> tuple[str, str, list[str]]:
        async with pool([servers[0].url]) as one, pool([servers[1].url]) as two:
            first = answer(await collect(one, job(one)))
            second = answer(await collect(two, job(two)))
        async with pool([s.url for s in servers], balancer=ROUND_ROBIN) as both:
            caplog.clear()
            answers = [answer(await collect(both, job(both))) for _ in range(4)]
        return first, second, answers

    first, second, answers = asyncio.run(main())
    assert first == second
    assert answers == [first] * 4
    assert sorted(answered_by(caplog)) == sorted([s.port for s in servers] * 2)


def test_the_speculating_server_answers_the_same_and_counts_its_drafts(servers):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Repeat: one two three four five six. " * 3}],
        "max_tokens": 32,
        "temperature": 0,
        "ignore_eos": True,
    }
    plain, spec = (
        httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60).json() for s in servers
    )
    assert plain["choices"][0]["message"] == spec["choices"][0]["message"]
    proposed = metric(servers[1], 'semgate_spec_decode_num_draft_tokens_total{method="ngram"}')
    accepted = metric(servers[1], 'semgate_spec_decode_num_accepted_tokens_total{method="ngram"}')
    assert 0 < accepted <= proposed
    assert "semgate_spec_decode" not in httpx.get(servers[0].url + "/metrics").text


def test_dead_url_is_unhealthy_and_requests_go_to_the_live_one(servers):
    async def main() -> list[list[Delta]]:
        async with pool([dead_url(), servers[0].url]) as upstream:
            assert upstream.ready()
            assert [s.healthy for s in upstream._servers] == [False, True]
            assert upstream.models() == [MODEL]
            return [await collect(upstream, job(upstream)) for _ in range(3)]

    for deltas in asyncio.run(main()):
        check_complete(deltas)


def test_health_reports_each_server_and_its_engine_load(servers):
    """Up or down per server, and a live server's running requests as its own
    /metrics counts them, re-read every health interval."""

    async def main() -> list[int | None]:
        async with pool([dead_url(), servers[0].url], health_interval=0.1) as upstream:
            dead, live = upstream.health()
            assert (dead.up, dead.running, dead.waiting) == (False, None, None)
            assert (live.up, live.running, live.waiting) == (True, 0, 0)
            chat = job(upstream, max_tokens=48, ignore_eos=True)
            answering = asyncio.create_task(collect(upstream, chat))
            running: list[int | None] = []
            while not answering.done():
                running.append(upstream.health()[1].running)
                await asyncio.sleep(0.05)
            assert answering.result()[-1].completion_tokens == 48
            return running

    assert 1 in asyncio.run(main())


def test_a_model_whose_servers_are_down_is_503_not_unknown(servers):
    async def main() -> None:
        async with pool([servers[0].url], health_interval=60.0) as upstream:
            upstream._mark_down(upstream._servers[0], "taken out by the test")
            assert upstream.models() == [MODEL]  # still known: not a 404
            with pytest.raises(UpstreamError) as info:
                await collect(upstream, job(upstream))
            assert info.value.status == 503
            assert info.value.code == "upstream_unavailable"

    asyncio.run(main())


def test_cache_salt_reaches_the_engine_server(servers):
    """The salt travels in the body (vLLM's `cache_salt`): the same long prompt under
    another salt finds none of the first one's prefix blocks."""
    server = servers[0]
    question = f"{uuid.uuid4()} Summarise the attached quarterly report for me. " * 6

    async def prefix_hits_after(salt: str) -> float:
        before = metric(server, "semgate_prefix_cache_hits_total")
        async with pool([server.url]) as upstream:
            await collect(upstream, job(upstream, question, max_tokens=1, cache_salt=salt))
        return metric(server, "semgate_prefix_cache_hits_total") - before

    async def main() -> list[float]:
        return [await prefix_hits_after(salt) for salt in ("a", "b", "a")]

    first, other_salt, same_salt = asyncio.run(main())
    assert first == other_salt == 0
    assert same_salt >= 48  # three blocks of 16 at least


def test_too_long_prompt_passes_the_400_through(servers):
    async def main() -> None:
        async with pool([servers[0].url]) as upstream:
            with pytest.raises(UpstreamError) as info:
                await collect(upstream, job(upstream, "hello " * (2 * MAX_MODEL_LEN)))
            assert info.value.status == 400
            assert info.value.type == "invalid_request_error"
            assert info.value.code == "context_length_exceeded"
            assert "context" in info.value.message or "token" in info.value.message
            assert [s.healthy for s in upstream._servers] == [True]  # not the server's fault

    asyncio.run(main())


def test_all_dead_is_503_with_retry_after():
    async def main() -> None:
        async with pool([dead_url(), dead_url()], health_interval=2.0) as upstream:
            assert not upstream.ready()
            assert upstream.models() == []
            chat = CompletionJob(
                request_id="t", model="m", messages=[{"role": "user", "content": "hi"}]
            )
            with pytest.raises(UpstreamError) as info:
                await collect(upstream, chat)
            assert info.value.status == 503
            assert info.value.code == "upstream_unavailable"
            assert info.value.retry_after == 2
            assert info.value.message.startswith("no healthy upstream")

    asyncio.run(main())


RUNNING = "semgate_num_requests_running"
ABORTED = 'semgate_requests_total{cache_status="bypass",finish_reason="abort"}'


def test_aclose_mid_stream_aborts_the_server_side_request(servers):
    server = servers[0]

    async def main() -> list[Delta]:
        async with pool([server.url]) as upstream:
            story = job(upstream, "Tell a story.", max_tokens=400, ignore_eos=True)
            stream = upstream.stream(story)
            got = [await anext(stream), await anext(stream)]
            assert all(d.text and d.finish_reason is None for d in got)
            assert metric(server, RUNNING) == 1
            aborted = metric(server, ABORTED, missing=0)
            await stream.aclose()
            # The server saw the disconnect and dropped the request: counted as aborted,
            # not finished.
            await until_async("the server drops it", lambda: metric(server, RUNNING) == 0)
            assert metric(server, ABORTED) == aborted + 1
            return await collect(upstream, job(upstream))

    check_complete(asyncio.run(main()))


def test_killed_server_fails_over_and_comes_back_after_restart(servers, caplog):
    caplog.set_level(logging.INFO, logger="httpx")
    victim, survivor = servers
    urls = [s.url for s in servers]

    async def fail_over() -> None:
        # A long health interval: the dead server is found by a request, which is retried.
        async with pool(urls, health_interval=60.0, balancer=ROUND_ROBIN) as upstream:
            assert all(s.healthy for s in upstream._servers)
            victim.stop(signal.SIGKILL)
            caplog.clear()
            for _ in range(2):  # round-robin sends one of the two to the dead server
                check_complete(await collect(upstream, job(upstream)))
            assert [s.healthy for s in upstream._servers] == [False, True]
            assert answered_by(caplog) == [survivor.port] * 2

    async def come_back() -> None:
        async with pool(urls, health_interval=0.5, balancer=ROUND_ROBIN) as upstream:
            assert [s.healthy for s in upstream._servers] == [False, True]
            victim.start()
            await asyncio.to_thread(victim.wait_ready, 120)
            await until_async("it is healthy again", lambda: upstream._servers[0].healthy)
            caplog.clear()
            for _ in range(2):
                check_complete(await collect(upstream, job(upstream)))
            assert sorted(answered_by(caplog)) == sorted(s.port for s in servers)

    asyncio.run(fail_over())
    asyncio.run(come_back())

"""Seeded answers counted like generated ones, TTLs past the maximum refused with
nothing stored, and a burst of repeated questions served from the cache, over HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cache.entry import CacheEntry
from cache.store import MAX_TTL
from gateway.replay import servable
from gateway.upstream import CompletionJob
from tests.engine.prompts import CAPITAL_QUESTION
from tests.gateway.conftest import ALICE, messages, seed, settle
from tests.gateway.servers import MODEL, Server, probed

LONG_ANSWER = " ".join(f"Light travels fast, step {i}." for i in range(80))  # 400 words


def chat(
    http: httpx.Client, question: str, headers: dict[str, str] | None = None, **kw: object
) -> httpx.Response:
    body = {"model": MODEL, "messages": messages(question), "temperature": 0, **kw}
    response = http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    settle(http.base_url)
    return response


@pytest.mark.usefixtures("fresh")
def test_a_seeded_answer_is_counted_and_kept_within_max_tokens(
    admin: httpx.Client, http: httpx.Client
):
    usage = seed(admin, "What is the speed of light?", LONG_ANSWER, "alice")["metadata"]
    assert usage["completion_tokens"] > 400 and usage["prompt_tokens"] > 0

    # Too long for max_tokens 3: the engine answers (cut at 3 tokens, so not stored).
    short = chat(http, "What is the speed of light?", max_tokens=3)
    assert short.headers["x-cache-status"] == "Miss"
    assert short.json()["choices"][0]["finish_reason"] == "length"
    assert short.json()["usage"]["completion_tokens"] == 3

    # The same question with room for it, and a paraphrase: hits, each reporting the
    # usage the entry was seeded with (counted as a miss of its question counts it), all
    # of its prompt served from cache.
    assert usage["prompt_tokens"] == short.json()["usage"]["prompt_tokens"]
    seeded_usage = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage["prompt_tokens"]},
    }
    exact = chat(http, "What is the speed of light?", max_tokens=1000)
    assert exact.headers["x-cache-status"] == "Hit"
    assert exact.json()["choices"][0]["message"]["content"] == LONG_ANSWER
    assert exact.json()["usage"] == seeded_usage
    hit = chat(http, "How fast does light travel?")
    assert hit.headers["x-cache-status"] == "Hit"
    assert hit.json()["usage"] == seeded_usage  # the original question's, not this one's


@pytest.mark.usefixtures("fresh")
def test_a_seeded_answer_counts_as_the_engine_counted_it(admin: httpx.Client, http: httpx.Client):
    generated = chat(http, CAPITAL_QUESTION, max_tokens=64).json()
    assert generated["choices"][0]["finish_reason"] == "stop"
    answer = generated["choices"][0]["message"]["content"]
    seeded = seed(admin, "Name the capital of France.", answer, "bob")
    assert seeded["metadata"]["completion_tokens"] == generated["usage"]["completion_tokens"]


@pytest.mark.parametrize(("max_tokens", "expected"), [(None, True), (21, True), (20, False)])
def test_an_answer_of_unknown_length_is_served_only_where_it_surely_fits(
    max_tokens: int | None, expected: bool
):
    """Entries without a count (seeded for a model of remote upstreams, or before counts
    were kept) fit if their bytes, a leading word marker and the end-of-sequence do."""
    entry = CacheEntry("id", "Q?", "Nineteen bytes long", "t", MODEL, "", "e", 0.0)
    job = CompletionJob("r", MODEL, [{"role": "user", "content": "Q?"}], max_tokens=max_tokens)
    assert servable(job, None, entry) is expected


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize("ttl", [10**20, MAX_TTL + 1])
def test_a_seed_with_a_ttl_past_the_maximum_is_refused_and_stores_nothing(
    admin: httpx.Client, ttl: int
):
    body = {"question": "Q?", "answer": "A.", "tenant": "alice", "ttl": ttl}
    response = admin.post("/admin/cache/entries", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "ttl"
    assert str(MAX_TTL) in error["message"]
    assert admin.get("/admin/cache/entries", params={"tenant": "alice"}).json()["total"] == 0


@pytest.mark.usefixtures("fresh")
def test_a_ttl_past_the_maximum_is_refused(admin: httpx.Client, http: httpx.Client):
    body = {"model": MODEL, "messages": messages("Q?"), "max_tokens": 4, "cache": {"ttl": 10**20}}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "cache.ttl"
    settle(http.base_url)
    assert admin.get("/admin/cache/entries", params={"tenant": "alice"}).json()["total"] == 0


@pytest.mark.usefixtures("fresh")
def test_a_burst_of_300_repeated_questions_is_served_from_the_cache(
    admin: httpx.Client, gateway: Server
):
    questions = [f"What is the population of city number {i}?" for i in range(10)]
    for q in questions:
        body = {"question": q, "answer": "About a million.", "tenant": "alice"}
        admin.post("/admin/cache/entries", json=body).raise_for_status()
    before = admin.get("/admin/cache/stats").json()

    async def burst() -> list[str]:
        limits = httpx.Limits(max_connections=300)
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with httpx.AsyncClient(
            base_url=gateway.url, headers=headers, limits=limits, timeout=120
        ) as client:

            async def one(i: int) -> str:
                question = [{"role": "user", "content": questions[i % 10]}]
                body = {"model": MODEL, "messages": question, "max_tokens": 32}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                return response.headers["x-cache-status"]

            return await asyncio.gather(*(one(i) for i in range(300)))

    # Nor does the burst starve the event loop: /metrics answers all along (asked from
    # another process, whose waits this one's own load cannot lengthen). ~25 ms p99 and
    # under 140 ms at worst here; the bound catches a freeze, it does not time it.
    with probed(gateway.url + "/metrics") as probe:
        statuses = asyncio.run(burst())
    print(f"/metrics during the burst: worst {max(probe.waits) * 1000:.0f} ms")
    assert probe.waits and max(probe.waits) < 1.0
    assert probe.failures == 0
    after = admin.get("/admin/cache/stats").json()
    assert after["errors"] == before["errors"]
    assert statuses == ["Hit"] * 300
    assert after["hits"] - before["hits"] == 300

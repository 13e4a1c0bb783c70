"""The chat endpoint over real HTTP, driven by the official openai SDK (sync and async,
streaming and not) and LangChain, against the session's gateway process."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import httpx
import openai
import pytest

from tests.engine.prompts import CAPITAL_QUESTION
from tests.gateway.conftest import ALICE, BOB, chat_body, settle, timings_of
from tests.gateway.servers import MODEL, Server, metric, wait_for_idle_engine

pytestmark = pytest.mark.usefixtures("fresh")


def ask(client: openai.OpenAI, question: str, **kw: object):
    raw = client.chat.completions.with_raw_response.create(**chat_body(question, **kw))
    settle(client.base_url)
    return raw.parse(), raw.headers


def test_miss_then_paraphrase_hit_then_near_miss(alice: openai.OpenAI):
    first, h1 = ask(alice, "How many legs does a spider have?")
    assert h1["x-cache-status"] == "Miss"
    assert first.object == "chat.completion" and first.choices[0].finish_reason == "stop"
    assert first.usage.completion_tokens > 0 and first.usage.prompt_tokens > 0
    assert first.id.startswith("chatcmpl-") and first.model == MODEL

    again, h2 = ask(alice, "How many legs do spiders have?")
    assert h2["x-cache-status"] == "Hit"
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.completion_tokens == first.usage.completion_tokens
    assert float(h2["x-cache-similarity"]) >= 0.7
    assert h2["x-cache-entry"] and int(h2["age"]) >= 0
    assert again.id != first.id

    near, h3 = ask(alice, "How many legs does an ant have?")
    assert h3["x-cache-status"] == "Miss"  # similar words, different question: the guard
    assert "x-cache-entry" not in h3
    assert near.choices[0].message.content


def test_async_streaming_miss_and_hit_replay(gateway: Server):
    async def main() -> tuple[list[str], list[str], str]:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0)
        statuses, texts = [], []
        for question in (
            "Who wrote Pride and Prejudice?",
            "Who is the author of Pride and Prejudice?",
        ):
            raw = await client.chat.completions.with_raw_response.create(
                **chat_body(question, stream=True, stream_options={"include_usage": True})
            )
            statuses.append(raw.headers["x-cache-status"])
            stream = raw.parse()
            text, usage, finish = "", None, None
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
            assert usage is not None and usage.completion_tokens > 0
            assert finish == "stop"
            texts.append(text)
            await asyncio.to_thread(settle, gateway.url)
        plain = await client.chat.completions.create(**chat_body("Who wrote Pride and Prejudice?"))
        return statuses, texts, plain.choices[0].message.content or ""

    statuses, texts, plain = asyncio.run(main())
    assert statuses == ["Miss", "Hit"]
    assert texts[0] and texts[0] == texts[1] == plain  # a hit replays in either form


def test_sse_framing(http: httpx.Client):
    body = chat_body("Name a primary colour.", stream=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-request-id"]
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert content.strip()


def test_tenants_never_share_answers(alice: openai.OpenAI, bob: openai.OpenAI):
    _, h = ask(alice, "What is the boiling point of water at sea level?")
    assert h["x-cache-status"] == "Miss"
    _, h = ask(bob, "What is the boiling point of water at sea level?")
    assert h["x-cache-status"] == "Miss"
    _, h = ask(bob, "At sea level, what temperature does water boil at?")
    assert h["x-cache-status"] == "Hit"  # bob's own entry


def test_tenants_never_share_prefix_cache_blocks(gateway: Server, http: httpx.Client):
    """A prefix hit is fast, so shared KV blocks would let one tenant time another's
    prompts: the engine's prefix cache is salted by tenant."""
    system = f"{uuid.uuid4()} You answer questions about the attached report. " * 8
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    no_store = {"Cache-Control": "no-store"}

    def prefix_hits_after(key: str) -> float:
        before = metric(gateway, "semgate_prefix_cache_hits_total")
        headers = {**no_store, "Authorization": f"Bearer {key}"}
        http.post("/v1/chat/completions", json=body, headers=headers).raise_for_status()
        return metric(gateway, "semgate_prefix_cache_hits_total") - before

    assert prefix_hits_after(ALICE) == 0
    assert prefix_hits_after(BOB) == 0  # the same prompt, another tenant
    assert prefix_hits_after(ALICE) >= 48  # alice's own blocks (three of 16 at least)


def test_cache_control_directives(http: httpx.Client, admin: httpx.Client):
    question = "What is the largest planet in the solar system?"

    def post(cache_control: str | None, **body: object) -> httpx.Response:
        headers = {"Cache-Control": cache_control} if cache_control else {}
        payload = chat_body(question, **body)
        response = http.post("/v1/chat/completions", json=payload, headers=headers)
        assert response.status_code == 200, response.text
        settle(http.base_url)
        return response

    assert post("no-store").headers["x-cache-status"] == "Bypass"
    assert admin.get("/admin/cache/entries", params={"tenant": "alice"}).json()["total"] == 0
    # Stored anyway, kept as long as the body's cache.ttl says.
    assert post("no-cache", cache={"ttl": 120}).headers["x-cache-status"] == "Bypass"
    entries = admin.get("/admin/cache/entries", params={"tenant": "alice"}).json()["data"]
    assert len(entries) == 1 and 0 < entries[0]["ttl"] <= 120
    assert post(None).headers["x-cache-status"] == "Hit"
    assert post("no-cache").headers["x-cache-status"] == "Bypass"
    # max-age is the oldest answer the client accepts (HTTP's meaning), not a TTL.
    assert post("max-age=3600").headers["x-cache-status"] == "Hit"
    assert post("max-age=0").headers["x-cache-status"] == "Miss"  # only a fresh answer
    bad = http.post(
        "/v1/chat/completions", json=chat_body(question), headers={"Cache-Control": "max-age=x"}
    )
    assert bad.status_code == 400 and "max-age" in bad.json()["error"]["message"]


def test_policy_bypasses_hot_sampling(http: httpx.Client):
    body = chat_body("Tell me a surprising fact.", temperature=1.5)
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["x-cache-status"] == "Bypass"


def test_concurrent_equivalent_misses_share_one_answer(gateway: Server):
    """Two identical questions at once: one runs on the engine, the other follows it."""
    results: list[httpx.Response] = []
    start = threading.Barrier(2)

    def post() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {ALICE}"}, timeout=120) as c:
            body = chat_body("Describe the water cycle.")
            start.wait()
            results.append(c.post(gateway.url + "/v1/chat/completions", json=body))

    threads = [threading.Thread(target=post) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200, 200]
    assert {r.headers["x-cache-status"] for r in results} == {"Miss"}
    assert sorted(r.headers.get("x-cache-coalesced", "") for r in results) == ["", "true"]
    texts = {r.json()["choices"][0]["message"]["content"] for r in results}
    assert len(texts) == 1
    # The follower tells its own lookup only: the engine's phases were the leader's.
    told = sorted(
        (r.headers.get("x-cache-coalesced", ""), list(timings_of(r.headers["server-timing"])))
        for r in results
    )
    assert told == [
        ("", ["cache", "embed", "queue", "prefill", "decode"]),
        ("true", ["cache", "embed"]),
    ]


def test_langchain_chat_openai(gateway: Server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=gateway.url + "/v1",
        api_key=ALICE,
        model=MODEL,
        temperature=0,
        max_tokens=96,
        max_retries=0,
    )
    answer = llm.invoke(CAPITAL_QUESTION)
    assert "Paris" in answer.content
    settle(gateway.url)
    streamed = "".join(str(chunk.content) for chunk in llm.stream(CAPITAL_QUESTION))
    assert streamed == answer.content  # the second call is a cache hit, replayed as a stream


def test_a_hit_aborts_the_engine_request_started_early(alice: openai.OpenAI, gateway: Server):
    """Misses start the engine while the cache is asked; on a hit that early request is
    aborted, so the engine is left with nothing running and no KV blocks in use."""
    aborted = 'semgate_early_starts_total{outcome="aborted"}'
    _, h = ask(alice, "What is the tallest mountain on Earth?")
    assert h["x-cache-status"] == "Miss"
    before = metric(gateway, aborted, missing=0)
    for _ in range(3):
        _, h = ask(alice, "Which mountain is the tallest on Earth?")
        assert h["x-cache-status"] == "Hit"
    wait_for_idle_engine(gateway)
    assert metric(gateway, "semgate_num_requests_running") == 0
    assert metric(gateway, "semgate_num_requests_waiting") == 0
    assert metric(gateway, "semgate_kv_cache_usage_perc") == 0
    assert metric(gateway, aborted) == before + 3  # each hit had started the engine


def test_an_exact_hit_starts_no_engine_request(alice: openai.OpenAI, gateway: Server):
    """The engine request starts early once the exact tier has missed: a miss uses it, an
    exact hit (the same question again) never starts one."""
    early = {o: f'semgate_early_starts_total{{outcome="{o}"}}' for o in ("used", "aborted")}
    before = {o: metric(gateway, name, missing=0) for o, name in early.items()}
    _, h = ask(alice, "How many moons does Mars have?")
    assert h["x-cache-status"] == "Miss"
    for _ in range(3):
        _, h = ask(alice, "How many moons does Mars have?")
        assert h["x-cache-status"] == "Hit" and h["x-cache-similarity"] == "1.0000"
    wait_for_idle_engine(gateway)
    after = {o: metric(gateway, name, missing=0) for o, name in early.items()}
    assert after == {"used": before["used"] + 1, "aborted": before["aborted"]}


def test_a_prefill_request_is_answered_uncached_with_no_transfer_without_a_store(
    gateway: Server,
):
    """vLLM's P/D protocol on the session's gateway, whose engine has no KV store: the
    request runs (never from the cache), and its answer names no transfer."""
    body = chat_body("What is the capital of Spain?", max_tokens=1)
    body["kv_transfer_params"] = {"do_remote_decode": True}
    headers = {"Authorization": f"Bearer {ALICE}"}
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-cache-status"] == "Bypass"
    assert response.headers["x-cache-bypass-reason"] == "kv_transfer_params"
    assert "kv_transfer_params" not in response.json()

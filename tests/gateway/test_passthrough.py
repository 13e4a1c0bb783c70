"""Pass-through: with `--upstream`, what the cache cannot key safely goes to the
upstream as it came and comes back as the upstream sent it (gateway/passthrough.py),
driven with the OpenAI SDK and LangChain against a fake OpenAI-compatible upstream that
records what it receives (tests/gateway/fake_upstream.py), behind a cache-on gateway."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from gateway.upstream import HttpUpstream
from tests.gateway.conftest import ADMIN, settle
from tests.gateway.fake_upstream import ARGUMENTS, ERROR, MODEL, SERVER_TIMING, FakeUpstream
from tests.gateway.servers import Server, caching_server, metric, serving

pytestmark = pytest.mark.slow  # starts a gateway of its own

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiplies two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def front(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ["--upstream", fake.url, "--admin-key", ADMIN]
    with serving(caching_server(tmp_path_factory, flags)) as [server]:
        yield server


@pytest.fixture(scope="module")
def client(front: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)


def question() -> list[dict[str, Any]]:
    """A question never asked before (nothing cached can answer it)."""
    return [{"role": "user", "content": f"What is 6 times 7? ({uuid.uuid4().hex[:8]})"}]


def bypasses(front: Server, reason: str) -> float:
    return metric(front, f'semgate_cache_bypasses_total{{reason="{reason}"}}', missing=0)


def entries(front: Server) -> int:
    """The cache's entries for the fake's model."""
    settle(front.url)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    found = httpx.get(front.url + "/admin/cache/entries", params={"model": MODEL}, headers=headers)
    return int(found.json()["total"])


def test_tools_pass_through_unchanged_and_are_never_cached(
    front: Server, fake: FakeUpstream, client: openai.OpenAI
):
    # vLLM's sampling fields go in the body as the SDK's `extra_body` puts them.
    extra = {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1}
    sent = {
        "model": MODEL,
        "messages": question(),
        "tools": TOOLS,
        "tool_choice": "auto",
        "temperature": 0,
        "user": "user-42",
        "seed": 7,
        "parallel_tool_calls": False,
    }
    before, stored = bypasses(front, "tools"), entries(front)
    for _ in range(2):  # asked twice: no store, no hit
        raw = client.chat.completions.with_raw_response.create(**sent, extra_body=extra)
        assert raw.headers["x-cache-status"] == "Bypass"
        assert raw.headers["x-cache-bypass-reason"] == "tools"
        assert raw.headers["server-timing"] == SERVER_TIMING  # the upstream's, passed on
        assert raw.headers["x-request-id"]
        call = raw.parse().choices[0].message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("multiply", ARGUMENTS)
        assert raw.parse().choices[0].finish_reason == "tool_calls"
        assert fake.bodies[-1] == {**sent, **extra}  # every field as it was sent
    assert bypasses(front, "tools") == before + 2
    assert entries(front) == stored


def test_streamed_tool_call_deltas_arrive_as_sent(front: Server, fake: FakeUpstream):
    body = {"model": MODEL, "messages": question(), "tools": TOOLS, "stream": True}
    with httpx.stream("POST", front.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert (r.headers["x-cache-status"], r.headers["x-cache-bypass-reason"]) == (
            "Bypass",
            "tools",
        )
        relayed = r.read()
    direct = httpx.post(fake.url + "/v1/chat/completions", json=body, timeout=30)
    assert relayed == direct.content  # byte for byte, [DONE] included
    assert fake.bodies[-2] == fake.bodies[-1] == body


def test_the_sdk_streams_tool_calls_logprobs_and_two_choices(front: Server, client: openai.OpenAI):
    stream = client.chat.completions.create(
        model=MODEL, messages=question(), tools=TOOLS, stream=True
    )
    arguments = "".join(
        call.function.arguments or ""
        for chunk in stream
        for choice in chunk.choices
        for call in choice.delta.tool_calls or []
    )
    assert json.loads(arguments) == json.loads(ARGUMENTS)

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=question(), logprobs=True, top_logprobs=2
    )
    assert raw.headers["x-cache-bypass-reason"] == "logprobs"
    logprobs = raw.parse().choices[0].logprobs
    assert logprobs is not None and logprobs.content[0].logprob == -0.25

    stream = client.chat.completions.create(model=MODEL, messages=question(), n=2, stream=True)
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == ["Answer 0 from the fake. ", "Answer 1 from the fake. "]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"n": 2}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"42": -100}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"top_k": 40}, "top_k"),
        ({"min_p": 0.1}, "min_p"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"reasoning_effort": "low"}, "unknown_field"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_each_reason(front: Server, fake: FakeUpstream, extra: dict[str, Any], reason: str):
    body = {"model": MODEL, "messages": question(), "temperature": 0, **extra}
    before = bypasses(front, reason)
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["x-cache-status"] == "Bypass"
    assert response.headers["x-cache-bypass-reason"] == reason
    assert fake.bodies[-1] == body
    assert bypasses(front, reason) == before + 1


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        (
            [
                {"role": "user", "content": "What is 6 times 7?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "multiply", "arguments": ARGUMENTS}}]},
                {"role": "tool", "tool_call_id": "call_0", "content": "42"},
            ],
            "tool_messages",
        ),
        (
            [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
            "non_text_content",
        ),
        ([{"role": "user", "content": "Hi", "prefix": True}], "unknown_field"),
    ],
)  # fmt: skip
def test_messages_the_cache_cannot_key(
    front: Server, fake: FakeUpstream, messages: list[dict[str, Any]], reason: str
):
    body = {"model": MODEL, "messages": messages}
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-cache-bypass-reason"] == reason
    assert fake.bodies[-1] == body


def test_cached_misses_carry_the_fields_the_cache_does_not_key(
    front: Server, fake: FakeUpstream, client: openai.OpenAI
):
    """`user`, `seed` and vLLM's sampling fields at neutral values reach the upstream on
    the cached path too; the answer is stored and the same question then hits."""
    messages = question()
    extra = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}

    def ask() -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, temperature=0, user="user-7", seed=3, extra_body=extra
        )
        assert "x-cache-bypass-reason" not in raw.headers
        settle(front.url)
        return raw.headers["x-cache-status"]

    received = len(fake.bodies)
    assert ask() == "Miss"
    body = fake.bodies[-1]
    assert body["stream"] is True  # the gateway's own request, teed into the cache
    assert {k: body[k] for k in ("user", "seed", *extra)} == {"user": "user-7", "seed": 3, **extra}
    assert ask() == "Hit"
    assert len(fake.bodies) == received + 1


def test_upstream_errors_keep_their_status_and_body(front: Server):
    body = {"model": MODEL, "messages": question(), "tools": TOOLS, "x_status": 418}
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 418
    assert response.json() == {"error": ERROR}
    assert response.headers["retry-after"] == "7"
    assert response.headers["x-cache-status"] == "Bypass"
    # A 401 from the upstream concerns the gateway's own key: the client gets a 502.
    body["x_status"] = 401
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"


def test_unknown_model_is_404_before_anything_is_forwarded(front: Server, fake: FakeUpstream):
    received = len(fake.bodies)
    body = {"model": "no-such-model", "messages": question(), "tools": TOOLS}
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert len(fake.bodies) == received


class Capital(BaseModel):
    city: str
    country: str


@tool
def multiply(a: int, b: int) -> int:
    """Multiplies two integers."""
    return a * b


def test_langchain_tools_and_structured_output(front: Server, fake: FakeUpstream):
    llm = ChatOpenAI(base_url=front.url + "/v1", api_key="unused", model=MODEL, max_retries=0)
    tooled = llm.bind_tools([multiply])
    call = tooled.invoke("What is 6 times 7?").tool_calls[0]
    assert (call["name"], call["args"]) == ("multiply", {"a": 6, "b": 7})
    assert fake.bodies[-1]["tools"][0]["function"]["name"] == "multiply"

    chunks = list(tooled.stream("What is 6 times 7?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.tool_calls[0]["args"] == {"a": 6, "b": 7}

    before = bypasses(front, "response_format")
    structured = llm.with_structured_output(Capital, method="json_schema")
    assert structured.invoke("Where is the Eiffel Tower?") == Capital(
        city="Paris", country="France"
    )
    assert fake.bodies[-1]["response_format"]["type"] == "json_schema"
    assert bypasses(front, "response_format") == before + 1


def test_a_server_that_went_down_is_skipped(fake: FakeUpstream):
    """Pass-through picks servers as cache misses do: one that refuses connections is
    marked down and the request goes to the next, which has it in flight until its
    response is closed."""

    async def main() -> list[bool]:
        with FakeUpstream() as doomed:
            upstream = HttpUpstream([doomed.url, fake.url], health_interval=60.0)
            await upstream.start()
        try:  # `doomed` is gone: the first request that picks it moves on
            for _ in range(2):
                body = {"model": MODEL, "messages": question(), "n": 2}
                server, resp = await upstream.post(MODEL, body, "t")
                assert server == fake.url
                assert [h.in_flight for h in upstream.health()] == [0, 1]
                assert len(json.loads(await resp.aread())["choices"]) == 2
                await resp.aclose()
                assert [h.in_flight for h in upstream.health()] == [0, 0]
            return [s.up for s in upstream.health()]
        finally:
            await upstream.close()

    assert asyncio.run(main()) == [False, True]

"""`usage.prompt_tokens_details.cached_tokens`: the prompt tokens the engine's prefix cache
served (JSON and the streamed usage chunk), read from upstreams (end to end through an
engine server: tests/gateway/test_remote.py), and on a semantic hit the usage the stored
answer cost originally."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import pytest

from gateway.upstream.base import Delta
from gateway.upstream.openai_wire import parse_sse
from tests.gateway.conftest import chat_body, settle
from tests.gateway.servers import MODEL

BLOCK_SIZE = 16  # the engine's KV block: a prefix hit is whole blocks
NO_STORE = {"Cache-Control": "no-store"}  # the semantic cache neither answers nor stores


def long_messages() -> list[dict[str, str]]:
    """A prompt of several blocks never sent before: the uuid lands in its first block,
    so nothing of it (not even the chat template's start) is in the prefix cache yet."""
    system = f"{uuid.uuid4()} You answer questions about the attached report. " * 6
    return [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]


def all_blocks_but_the_last_token(prompt_tokens: int) -> int:
    """What a prefix hit on the whole prompt serves: every full block short of the last
    token (computed for the first answer token's logits)."""
    return (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


def post(http: httpx.Client, body: dict[str, object], **headers: str) -> dict[str, object]:
    response = http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_repeated_prompt_reports_the_prefix_cache_hit_in_json_and_stream(
    http: httpx.Client, alice: openai.OpenAI
):
    body = {"model": MODEL, "messages": long_messages(), "max_tokens": 2, "temperature": 0}
    first = post(http, body, **NO_STORE)["usage"]
    assert first["prompt_tokens"] > 4 * BLOCK_SIZE
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}  # known to be none

    second = post(http, body, **NO_STORE)["usage"]
    assert second["prompt_tokens"] == first["prompt_tokens"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == all_blocks_but_the_last_token(second["prompt_tokens"]) > 0

    stream = alice.chat.completions.create(
        **body, stream=True, stream_options={"include_usage": True}, extra_headers=NO_STORE
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens == second["prompt_tokens"]
    assert usage[0].prompt_tokens_details is not None
    assert usage[0].prompt_tokens_details.cached_tokens == cached


@pytest.mark.usefixtures("fresh")
def test_a_semantic_hit_reports_the_usage_the_answer_cost_originally(
    http: httpx.Client, alice: openai.OpenAI
):
    question, paraphrase = "How many legs does a spider have?", "How many legs do spiders have?"
    original = post(http, chat_body(question))["usage"]
    settle(http.base_url)
    # The paraphrase's own prompt counts otherwise: the hit must not report it.
    own = post(http, chat_body(paraphrase, max_tokens=1), **NO_STORE)["usage"]
    assert own["prompt_tokens"] != original["prompt_tokens"]

    expected = {
        "prompt_tokens": original["prompt_tokens"],
        "completion_tokens": original["completion_tokens"],
        "total_tokens": original["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": original["prompt_tokens"]},
    }
    response = http.post("/v1/chat/completions", json=chat_body(paraphrase))
    assert response.headers["x-cache-status"] == "Hit"
    assert response.json()["usage"] == expected

    raw = alice.chat.completions.with_raw_response.create(
        **chat_body(paraphrase, stream=True, stream_options={"include_usage": True})
    )
    assert raw.headers["x-cache-status"] == "Hit"
    usage = [chunk.usage for chunk in raw.parse() if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].model_dump(exclude_none=True) == expected


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"prompt_tokens_details": {"cached_tokens": 32}}, 32),
        ({"prompt_tokens_details": {"cached_tokens": 0}}, 0),
        ({"prompt_tokens_details": {"cached_tokens": None}}, None),  # vLLM may send null
        ({"prompt_tokens_details": None}, None),
        ({}, None),  # no details: unknown, not 0
    ],
)
def test_an_upstreams_cached_tokens_are_read_where_it_sends_them(
    usage: dict[str, object], cached: int | None
):
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 1, **usage}},
    ]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    async def final() -> Delta:
        return [d async for d in parse_sse(httpx.Response(200, content=sse.encode()))][-1]

    delta = asyncio.run(final())
    assert (delta.prompt_tokens, delta.cached_tokens) == (40, cached)

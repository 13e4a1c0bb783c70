"""POST /v1/completions (gateway/routes/text_completions.py): the raw prompt continued by the
in-process engine with no chat template, never cached, driven with the OpenAI SDK
against the session's gateway; and forwarded as received to an upstream."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from tests.gateway import fake_upstream
from tests.gateway.conftest import timings_of
from tests.gateway.fake_upstream import COMPLETION, FakeUpstream
from tests.gateway.servers import MODEL, Server, metric

PROMPT = "The capital of France is"


def greedy(llm: LLM, prompt: str | list[int], max_tokens: int, ignore_eos: bool = False) -> str:
    """The engine's own greedy continuation of the raw prompt."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
    return llm.generate(prompt, params)[0].text


def bypasses(server: Server) -> float:
    return metric(server, 'semgate_cache_bypasses_total{reason="completions"}', missing=0)


def test_greedy_text_continues_the_raw_prompt(gateway: Server, alice: openai.OpenAI, llm: LLM):
    before = bypasses(gateway)
    raw = alice.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0
    )
    assert raw.headers["x-cache-status"] == "Bypass"
    assert raw.headers["x-cache-bypass-reason"] == "completions"
    assert {"queue", "prefill", "decode"} <= timings_of(raw.headers["server-timing"]).keys()
    completion = raw.parse()
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert choice.text == greedy(llm, PROMPT, 8)
    assert "Paris" in choice.text  # continued, not answered as a chat turn
    assert (choice.finish_reason, completion.usage.completion_tokens) == ("length", 8)
    # The raw prompt's tokens: no chat template around it.
    tokenizer = llm.tokenizer
    assert completion.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    templated = tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    )
    assert completion.usage.prompt_tokens < len(templated)
    assert bypasses(gateway) == before + 1
    again = alice.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert again.choices[0].text == choice.text  # never served from the cache: regenerated
    assert bypasses(gateway) == before + 2


def test_streamed_with_usage(alice: openai.OpenAI, llm: LLM):
    chunks = list(
        alice.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.object for c in chunks} == {"text_completion"}
    text = "".join(choice.text for c in chunks for choice in c.choices)
    assert text == greedy(llm, PROMPT, 8)
    assert [choice.finish_reason for choice in chunks[-2].choices] == ["length"]
    usage = chunks[-1].usage
    assert (chunks[-1].choices, usage.completion_tokens) == ([], 8)
    assert usage.prompt_tokens == len(llm.tokenizer.encode(PROMPT))


def test_token_ids_echo_and_the_default_max_tokens(alice: openai.OpenAI, llm: LLM):
    ids = llm.tokenizer.encode(PROMPT)
    completion = alice.completions.create(
        model=MODEL, prompt=ids, temperature=0, echo=True, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].text == PROMPT + greedy(llm, ids, 16, ignore_eos=True)
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (len(ids), 16)
    streamed = alice.completions.create(
        model=MODEL, prompt=[PROMPT], max_tokens=4, temperature=0, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == PROMPT + greedy(llm, PROMPT, 4)


def test_stop_strings(alice: openai.OpenAI, llm: LLM):
    full = greedy(llm, PROMPT, 8)
    stop = full.split()[1]  # the continuation's second word
    completion = alice.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop]
    )
    assert completion.choices[0].text == full[: full.index(stop)]
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        # What the in-process engine cannot do: OpenAI's code for a model's refusal.
        ({"n": 2}, "n", "unsupported_value"),
        ({"best_of": 3}, "best_of", "unsupported_value"),
        ({"logprobs": 1}, "logprobs", "unsupported_value"),
        ({"suffix": " and so on."}, "suffix", "unsupported_value"),
        ({"prompt": ["one", "two"]}, "prompt", "unsupported_value"),
        ({"prompt": [10**9]}, "prompt", "unsupported_value"),  # past its vocabulary
        # What no request may be, as the OpenAPI document says: decoding refuses it.
        ({"prompt": ""}, "prompt", None),
        ({"prompt": []}, "prompt", None),
        ({"prompt": [-1]}, "prompt[0]", None),
        ({"prompt": "word " * 20_000}, "prompt", "context_length_exceeded"),
        ({"max_tokens": 10**6}, "max_tokens", "context_length_exceeded"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    alice: openai.OpenAI, fields: dict[str, Any], param: str, code: str | None
):
    request: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        alice.completions.create(**request)
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == (param, code)


def test_forwarded_to_the_upstream_as_received(fake_front: Server, fake: FakeUpstream):
    client = openai.OpenAI(base_url=fake_front.url + "/v1", api_key="unused", max_retries=0)
    # What the in-process engine refuses goes on as it came (vLLM's fields included).
    sent = {"model": fake_upstream.MODEL, "prompt": [PROMPT, "Two"], "max_tokens": 5,
            "logprobs": 2, "suffix": "!", "n": 2, "user": "user-42"}  # fmt: skip
    before = bypasses(fake_front)
    raw = client.completions.with_raw_response.create(**sent, extra_body={"top_k": 40})
    assert fake.bodies[-1] == {**sent, "top_k": 40}
    assert raw.headers["x-cache-status"] == "Bypass"
    assert raw.headers["x-cache-bypass-reason"] == "completions"
    assert raw.parse().choices[0].text == COMPLETION
    assert bypasses(fake_front) == before + 1

    body = {"model": fake_upstream.MODEL, "prompt": PROMPT, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", fake_front.url + "/v1/completions", json=body, timeout=30) as r:
        relayed = r.read()
    direct = httpx.post(fake.url + "/v1/completions", json=body, timeout=30)
    assert relayed == direct.content  # byte for byte, [DONE] included
    assert fake.bodies[-2] == fake.bodies[-1] == body

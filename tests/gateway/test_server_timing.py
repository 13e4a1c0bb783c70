"""Where a request's time went, told to its client (Server-Timing, a stream's last-chunk
`timings`) and to /metrics (the engine's phase histograms), by the session's gateway."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from gateway.server_timing import merge, parse
from tests.gateway.conftest import chat_body, messages, settle, timings_of
from tests.gateway.servers import MODEL, Server, metric

ENGINE = ["queue", "prefill", "decode"]
PHASES = [
    f'semgate_request_{phase}_time_seconds_count{{model_name="{MODEL}"}}'
    for phase in ("queue", "prefill", "decode", "inference")
]


def test_an_upstreams_server_timing_is_read_as_browsers_read_it():
    header = 'db;dur=53, miss, cdn;desc="a, b;dur=9";dur=3.25, app;dur=47.2;dur=1, bad;dur=x'
    assert parse(header) == {"db": 53.0, "cdn": 3.25, "app": 47.2}
    assert parse("") == {}
    own = {"cache": 1.0}
    assert merge(own, {"cache": 2.0, "queue": 3.0}) == {
        "cache": 1.0,
        "upstream-cache": 2.0,
        "queue": 3.0,
    }
    assert merge(own, None) == own


@pytest.mark.usefixtures("fresh")
def test_a_miss_tells_the_lookup_and_the_engine_phases_and_a_hit_the_lookup(
    gateway: Server, http: httpx.Client
):
    before = [metric(gateway, sample, missing=0) for sample in PHASES]
    body = chat_body("How many legs does a spider have?")
    t0 = time.perf_counter()
    miss = http.post("/v1/chat/completions", json=body)
    elapsed = (time.perf_counter() - t0) * 1000
    assert miss.headers["x-cache-status"] == "Miss"
    timings = timings_of(miss.headers["server-timing"])
    assert list(timings) == ["cache", "embed", *ENGINE]
    assert timings["embed"] <= timings["cache"] <= elapsed
    # The engine's phases follow one another (the lookup may overlap them: early start).
    assert sum(timings[phase] for phase in ENGINE) <= elapsed
    assert [metric(gateway, sample) for sample in PHASES] == [n + 1 for n in before]
    settle(gateway.url)

    for question, tiers in (
        ("How many legs do spiders have?", ["cache", "embed"]),  # the semantic tier
        ("How many legs does a spider have?", ["cache"]),  # the exact tier embeds nothing
    ):
        t0 = time.perf_counter()
        hit = http.post("/v1/chat/completions", json=chat_body(question))
        elapsed = (time.perf_counter() - t0) * 1000
        assert hit.headers["x-cache-status"] == "Hit"
        timings = timings_of(hit.headers["server-timing"])
        assert list(timings) == tiers and timings["cache"] <= elapsed
    # Hits cost the engine nothing it finished (their early starts were aborted).
    assert [metric(gateway, sample) for sample in PHASES] == [n + 1 for n in before]


def test_a_bypass_tells_the_engine_phases_only(http: httpx.Client):
    body = chat_body("Name a colour.", max_tokens=8)
    response = http.post("/v1/chat/completions", json=body, headers={"Cache-Control": "no-store"})
    assert response.headers["x-cache-status"] == "Bypass"
    assert list(timings_of(response.headers["server-timing"])) == ENGINE


@pytest.mark.usefixtures("fresh")
def test_a_stream_tells_its_start_in_the_header_and_the_rest_on_its_last_chunk(
    http: httpx.Client,
):
    body = chat_body("Name a large ocean.", stream=True, stream_options={"include_usage": True})
    t0 = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        head = timings_of(response.headers["server-timing"])
        lines = [line for line in response.iter_lines() if line]
    elapsed = (time.perf_counter() - t0) * 1000
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    # Known as the headers left: the lookup, the engine's queue and prefill.
    assert list(head) == ["cache", "embed", "queue", "prefill"]
    last = chunks[-1]
    assert last["usage"]["total_tokens"] > 0
    assert list(last["timings"]) == ["cache", "embed", *ENGINE]
    assert {name: last["timings"][name] for name in head} == head  # the same measurements
    assert sum(last["timings"][phase] for phase in ENGINE) <= elapsed
    assert all("timings" not in chunk for chunk in chunks[:-1])


@pytest.mark.usefixtures("fresh")
def test_the_sdk_reads_the_timings_of_a_stream_without_usage(alice: openai.OpenAI):
    """Without stream_options.include_usage the finish_reason chunk is the last one: it
    carries them, and the SDK keeps the extra field."""
    stream = alice.chat.completions.create(
        model=MODEL, messages=messages("Name a planet."), max_tokens=8, stream=True
    )
    chunks = list(stream)
    extras = [(chunk.model_extra or {}).get("timings") for chunk in chunks]
    assert chunks[-1].choices[0].finish_reason
    assert extras[:-1] == [None] * (len(chunks) - 1)
    assert list(extras[-1]) == ["cache", "embed", *ENGINE]
    assert all(ms >= 0 for ms in extras[-1].values())

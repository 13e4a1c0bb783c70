"""`semgate serve --upstream`: a cache-on gateway in front of a real engine server
(`semgate serve --no-cache`, the session's: tests/gateway/conftest.py), over real HTTP
on both hops."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.embeddings import BUNDLED_NAME as EMBEDDER
from tests.gateway.conftest import ADMIN, chat_body, messages, settle, timings_of
from tests.gateway.servers import MODEL, Server, caching_server, metric, serving
from tests.waiting import until

pytestmark = pytest.mark.slow  # starts a gateway of its own in front of the engine server


@pytest.fixture(scope="module")
def engine(engine_server: Server) -> Server:
    return engine_server


@pytest.fixture(scope="module")
def front(engine: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ["--upstream", engine.url, "--admin-key", ADMIN, "--upstream-header"]
    with serving(caching_server(tmp_path_factory, flags)) as [server]:
        yield server


def test_misses_go_upstream_and_come_back_as_hits(front: Server):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL, EMBEDDER]

    def ask(question: str) -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(question), temperature=0, max_tokens=96
        )
        settle(front.url)
        return raw.parse().choices[0].message.content or "", raw.headers["x-cache-status"]

    # (A question the 135M model answers right in every weight mode: asked about Italy it
    # names "Il Coriobella" as often as Rome, in float32 too.)
    answer, status = ask("What is the capital of Spain?")
    assert status == "Miss" and "Madrid" in answer
    assert ask("Which city is the capital of Spain?") == (answer, "Hit")


def test_metrics_report_the_upstream_and_its_load(front: Server, engine: Server):
    upstream = f'{{upstream="{engine.url}"}}'
    assert metric(front, "semgate_upstream_up" + upstream) == 1
    # Read at each health check (every 5 s): one may have caught an earlier request.
    until(
        "the idle engine's load reads 0",
        lambda: metric(front, "semgate_upstream_num_requests_running" + upstream) == 0,
    )
    assert metric(front, "semgate_upstream_num_requests_waiting" + upstream) == 0
    assert metric(front, "semgate_num_requests_running", missing=-1) == -1  # no engine here


def test_streaming_passes_through_token_by_token(front: Server, engine: Server):
    body = chat_body("Name three fruits.", stream=True, max_tokens=24, ignore_eos=True)
    with httpx.stream("POST", front.url + "/v1/chat/completions", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line[6:].startswith("{")]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([c for c in contents if c]) >= 12  # about one chunk per token, not one blob


def test_server_timing_passes_the_engine_servers_phases_through(front: Server, engine: Server):
    """The engine server's phases (its Server-Timing, its last chunk's `timings`) come
    through the front, after the front's own lookup; only the engine server observes
    them into its phase histograms."""
    phases = f'semgate_request_queue_time_seconds_count{{model_name="{MODEL}"}}'
    observed = metric(engine, phases, missing=0)
    engine_only = ["queue", "prefill", "decode"]
    direct = httpx.post(engine.url + "/v1/chat/completions", json=chat_body("Hi!"), timeout=60)
    assert list(timings_of(direct.headers["server-timing"])) == engine_only  # its cache is off

    t0 = time.perf_counter()
    body = chat_body("Name a river in Africa.", max_tokens=16)
    answer = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=60)
    elapsed = (time.perf_counter() - t0) * 1000
    assert answer.headers["x-cache-status"] == "Miss"
    timings = timings_of(answer.headers["server-timing"])
    assert list(timings) == ["cache", "embed", *engine_only]
    # No early start against remote servers: the engine's phases follow the lookup.
    assert timings["cache"] + sum(timings[phase] for phase in engine_only) <= elapsed

    body = chat_body("Name a river in Asia.", max_tokens=16, stream=True)
    headers = {"Cache-Control": "no-store"}  # the engine's phases only: no lookup
    with httpx.stream(
        "POST", front.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        head = timings_of(r.headers["server-timing"])
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line[6:].startswith("{")]
    assert list(head) == ["queue", "prefill"]  # the engine server's, as its stream began
    assert list(chunks[-1]["timings"]) == engine_only
    assert metric(engine, phases) == observed + 3
    assert metric(front, phases, missing=-1) == -1  # the front runs no engine


def test_the_engine_servers_prefix_cache_hit_comes_through(front: Server):
    """usage.prompt_tokens_details.cached_tokens as the engine server reports it: none
    for a new prompt (a uuid in its first block), its whole blocks when asked again."""
    system = f"{uuid.uuid4()} You answer questions about the attached report. " * 6
    body = chat_body("Hi", max_tokens=2)
    body["messages"] = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]

    def usage() -> dict[str, Any]:
        headers = {"Cache-Control": "no-store"}  # answered by the engine server each time
        url = front.url + "/v1/chat/completions"
        return httpx.post(url, json=body, headers=headers, timeout=60).json()["usage"]

    first, second = usage(), usage()
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == (second["prompt_tokens"] - 1) // 16 * 16 > 0  # short of the last token


def test_x_upstream_names_the_server_that_answered_a_miss(front: Server, engine: Server):
    # A question no test here asked before, whose answer ends (23 tokens): stored. Not
    # made unique with a uuid: the model's answer then names the uuid, at times past
    # max_tokens, and a cut answer is not stored.
    body = chat_body("Name a planet.")
    url = front.url + "/v1/chat/completions"
    miss = httpx.post(url, json=body, timeout=60)
    settle(front.url)
    hit = httpx.post(url, json=body, timeout=60)
    assert (miss.headers["x-cache-status"], miss.headers["x-upstream"]) == ("Miss", engine.url)
    assert hit.headers["x-cache-status"] == "Hit" and "x-upstream" not in hit.headers
    with httpx.stream("POST", url, json={**body, "stream": True},
                      headers={"Cache-Control": "no-store"}, timeout=60) as streamed:  # fmt: skip
        assert streamed.headers["x-upstream"] == engine.url


def test_a_sessions_requests_and_the_routing_are_shown(front: Server, engine: Server):
    """X-Session-Id keeps a session on its server (one here: counted as `session` from
    its second request on); /admin/upstreams and /metrics show the choices."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    before = metric(front, 'semgate_upstream_requests_total{reason="session"}', missing=0)
    headers = {"Cache-Control": "no-store", "X-Session-Id": f"conv-{uuid.uuid4()}"}
    for question in ("Name a colour.", "Name a fruit."):
        body = chat_body(question + " Think of the sea, the sky and the fields." * 4, max_tokens=4)
        url = front.url + "/v1/chat/completions"
        assert httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200
    assert metric(front, 'semgate_upstream_requests_total{reason="session"}') == before + 1
    [shown] = httpx.get(front.url + "/admin/upstreams", headers=admin).json()
    assert shown["upstream"] == engine.url and shown["models"] == [MODEL]
    assert (shown["up"], shown["policy"], shown["weight"]) == (True, "prefix", 1.0)
    assert shown["in_flight"] == 0 == metric(front, "semgate_upstream_in_flight")
    assert shown["requests"]["session"] == before + 1
    total = metric(front, f'semgate_upstream_requests_total{{upstream="{engine.url}"}}')
    assert sum(shown["requests"].values()) == total >= 2
    assert shown["prefix_blocks"] > 0  # the questions' start fills a block and more
    assert httpx.get(front.url + "/admin/upstreams").status_code == 401


def test_upstream_refusals_keep_their_status(front: Server):
    body = chat_body("hello " * 9000)
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_engine_dying_mid_stream_is_an_error_event_not_a_truncation(front: Server, engine: Server):
    """Runs last: it kills the engine server (the next module to use it starts it again)."""
    body = chat_body("Tell a story.", stream=True, max_tokens=400, ignore_eos=True)
    headers = {"Cache-Control": "no-store"}
    with httpx.stream(
        "POST", front.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(8):
            next(lines)
        engine.stop(signal.SIGKILL)
        rest = [line for line in lines if line]
    events = [json.loads(line[6:]) for line in rest if line[6:].startswith("{")]
    assert "error" in events[-1], rest[-3:]
    assert events[-1]["error"]["message"]
    assert not any(e.get("choices") and e["choices"][0]["finish_reason"] for e in events)
    after = httpx.post(front.url + "/v1/chat/completions", json=chat_body("Hi?"), timeout=60)
    assert after.status_code == 503 and int(after.headers["retry-after"]) >= 1
    # "not_ready" once the gateway has marked its only upstream down, else the retry
    # over the (dead) pool answers "upstream_unavailable".
    assert after.json()["error"]["code"] in ("not_ready", "upstream_unavailable")

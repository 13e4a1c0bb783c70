"""Prefill and decode apart (gateway/upstream/disaggregation.py): a real gateway in front
of a stand-in vLLM pair (tests/gateway/fake_upstream.py), one prefill server answering
with kv_transfer_params as vLLM's NixlConnector does, one decode server. The shapes of
both hops are vLLM's own P/D proxy's (its toy_proxy_server.py); what is not prefilled
remotely (a short or mostly cached prompt, a busy, failing or dead prefill server) is
answered by the decode server alone, never failed. Cache off: this is about the upstreams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.main import build_parser
from cli.serve_command import _settings
from gateway.metrics import GatewayMetrics
from gateway.runtime import build_upstream
from gateway.settings import Settings
from gateway.upstream.disaggregation import Disaggregated
from tests.gateway.conftest import timings_of
from tests.gateway.fake_upstream import MODEL, PREFILL_PARAMS, SERVER_TIMING, FakeUpstream
from tests.gateway.servers import Server, free_port, metric, ready, serving
from tests.waiting import until

pytestmark = pytest.mark.slow  # two gateways of its own, and health checks waited for

ADMIN = "sk-admin-pd"
MIN_TOKENS = 64  # the gateway's --pd-min-prompt-tokens
# vLLM's proxy asks a prefill server for this, whatever the request.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False} | dict.fromkeys(
    ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")
)
# About 500 tokens by the gateway's estimate (4 bytes a token): well above MIN_TOKENS.
DOCUMENT = " ".join(f"Paragraph {i} of the manual says what part {i} does." for i in range(40))


@pytest.fixture(scope="module")
def decode() -> Iterator[FakeUpstream]:
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def prefill() -> Iterator[FakeUpstream]:
    with FakeUpstream(prefill=True) as upstream:
        upstream.waiting = 0  # a /metrics from the start: the gateway reads its queue
        yield upstream


def pd_flags(decode: str, prefill: str) -> list[str]:
    return [
        "--no-cache", "--admin-key", ADMIN,
        "--upstream", f"{MODEL}={decode}", "--upstream-prefill", f"{MODEL}={prefill}",
        "--pd-min-prompt-tokens", str(MIN_TOKENS), "--pd-prefill-timeout", "1",
        "--pd-failure-backoff", "0",  # each test's prefill fault is its own
    ]  # fmt: skip


def all_up(server: Server) -> bool:
    answer = ready(server)
    return answer.status_code == 200 and all(u["up"] for u in answer.json()["upstreams"])


@pytest.fixture(scope="module")
def front(decode: FakeUpstream, prefill: FakeUpstream) -> Iterator[Server]:
    with serving(Server(pd_flags(decode.url, prefill.url))) as [server]:
        until("both pools are up", lambda: all_up(server))
        yield server


def rag(question: str, manual: str | None = None) -> list[dict[str, str]]:
    """`question` after a long manual: its own (a prompt no server has seen), unless the
    one of an earlier question is named."""
    manual = manual or question
    return [
        {"role": "system", "content": f"Answer from the manual of {manual!r}.\n{DOCUMENT}"},
        {"role": "user", "content": question},
    ]


def post(front: Server, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
    request_id = f"pd-{uuid.uuid4().hex[:8]}"
    answer = httpx.post(
        front.url + path, json=body, headers={"X-Request-Id": request_id}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == request_id
    return answer


def decisions(front: Server, route: str, reason: str) -> float:
    return metric(front, f'semgate_pd_requests_total{{route="{route}",reason="{reason}"}}', 0)


def without(body: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: value for name, value in body.items() if name not in names}


def as_prefilled(body: dict[str, Any], **more: Any) -> dict[str, Any]:
    """`body` (what the decode server got, without the params) as vLLM's proxy sends it to
    the prefill server."""
    sent = without(body, "stream_options", "min_tokens", "min_completion_tokens")
    return {**sent, "stream": False, "max_tokens": 1, "kv_transfer_params": REMOTE_DECODE, **more}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_long_prompt_is_prefilled_remotely_then_decoded_with_the_prefills_params(
    front: Server, decode: FakeUpstream, prefill: FakeUpstream, stream: bool
):
    """The cached path (a job): the prefill server gets the decode server's request as
    vLLM's proxy sends it, under the same X-Request-Id; the decode server gets the job
    unchanged but for the params the prefill answered. Server-Timing leads with the
    remote prefill, then the decode server's own phases."""
    remote = decisions(front, "remote", "long_prompt")
    body = {"model": MODEL, "messages": rag(f"What does part 3 do ({stream=})?"), "max_tokens": 9}
    answer = post(front, {**body, "stream": stream})
    sent = decode.bodies[-1]
    assert sent["kv_transfer_params"] == PREFILL_PARAMS
    assert sent["stream"] is True and sent["max_tokens"] == 9
    assert sent["messages"] == body["messages"]
    assert prefill.bodies[-1] == as_prefilled(without(sent, "kv_transfer_params"))
    assert prefill.request_ids[-1] == decode.request_ids[-1] == answer.headers["x-request-id"]
    timings = timings_of(answer.headers["server-timing"])
    assert list(timings) == ["pd-prefill", "queue", "prefill", "decode"]
    assert timings["pd-prefill"] >= 0
    if stream:  # the last chunk's timings have it too
        last = [line for line in answer.text.splitlines() if '"timings"' in line][-1]
        assert '"pd-prefill"' in last
    else:
        assert answer.json()["choices"][0]["message"]["content"].startswith("Answer 0")
    assert decisions(front, "remote", "long_prompt") == remote + 1


def test_pass_throughs_and_text_completions_are_prefilled_at_their_own_endpoint(
    front: Server, decode: FakeUpstream, prefill: FakeUpstream
):
    """A pass-through (n > 1) and a text completion go to each server as they came, the
    prefill server's at the same endpoint: max_completion_tokens is 1 there too, and
    min_tokens is the decode server's alone."""
    chat = {
        "model": MODEL, "messages": rag("What does part 7 do?"), "n": 2,
        "max_completion_tokens": 12, "min_tokens": 2, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    answer = post(front, chat)
    assert answer.headers["x-cache-bypass-reason"] == "n"
    assert decode.bodies[-1] == {**chat, "kv_transfer_params": PREFILL_PARAMS}
    assert prefill.bodies[-1] == as_prefilled(chat, max_completion_tokens=1)
    assert next(iter(timings_of(answer.headers["server-timing"]))) == "pd-prefill"

    text = {"model": MODEL, "prompt": DOCUMENT, "max_tokens": 5, "min_tokens": 1}
    answer = post(front, text, "/v1/completions")
    assert answer.json()["choices"][0]["text"]
    assert decode.bodies[-1] == {**text, "kv_transfer_params": PREFILL_PARAMS}
    assert prefill.bodies[-1] == as_prefilled(text)
    assert next(iter(timings_of(answer.headers["server-timing"]))) == "pd-prefill"


def test_a_short_or_mostly_cached_prompt_never_touches_the_prefill_server(
    front: Server, decode: FakeUpstream, prefill: FakeUpstream
):
    """Dynamo's rule: what counts is the part of the prompt the decode server has not
    seen. A short question is decoded alone; so is a new question after the manual the
    decode server was sent before (its prefix cache holds it)."""
    asked = len(prefill.bodies)
    post(front, {"model": MODEL, "messages": rag("What does part 1 do?"), "max_tokens": 4})
    assert len(prefill.bodies) == asked + 1  # the manual's first time: prefilled remotely
    asked += 1
    short = decisions(front, "local", "short_prompt")
    cached = rag("And part 2?", manual="What does part 1 do?")
    for messages in ([{"role": "user", "content": "Hi?"}], cached):
        answer = post(front, {"model": MODEL, "messages": messages, "max_tokens": 4})
        assert "kv_transfer_params" not in decode.bodies[-1]
        assert "pd-prefill" not in timings_of(answer.headers["server-timing"])
    assert len(prefill.bodies) == asked
    assert decisions(front, "local", "short_prompt") == short + 2


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("failing", "prefill_failed"), ("slow", "prefill_failed"), ("no_connector", "no_params")],
)
def test_a_failing_prefill_server_means_a_local_prefill(
    front: Server, decode: FakeUpstream, prefill: FakeUpstream, fault: str, reason: str
):
    """A prefill server that fails the request (500), takes longer than
    --pd-prefill-timeout, or answers without kv_transfer_params (a vLLM without a KV
    connector) costs the request its remote prefill only: the decode server gets it
    unchanged and answers."""
    local = decisions(front, "local", reason)
    if fault == "failing":
        prefill.failing = 500
    elif fault == "slow":
        prefill.delay = 2.0
    else:
        prefill.prefill = False
    try:
        asked = len(prefill.bodies)
        body = {"model": MODEL, "messages": rag(f"What does part {fault} do?"), "max_tokens": 4}
        answer = post(front, body)
    finally:
        prefill.failing, prefill.delay, prefill.prefill = None, 0.0, True
    assert len(prefill.bodies) == asked + 1
    assert "kv_transfer_params" not in decode.bodies[-1]
    assert answer.json()["choices"][0]["message"]["content"].startswith("Answer 0")
    assert decisions(front, "local", reason) == local + 1


def test_after_a_prefill_without_params_the_next_prompts_prefill_locally_for_a_while(
    decode: FakeUpstream, prefill: FakeUpstream
):
    """A prefill server that answers without kv_transfer_params (its KV store is down) is
    not asked again for --pd-failure-backoff seconds: a prompt it cannot hand over would
    be computed twice."""
    flags = [*pd_flags(decode.url, prefill.url)[:-2], "--pd-failure-backoff", "60"]
    with serving(Server(flags)) as [server]:
        until("both pools are up", lambda: all_up(server))
        prefill.prefill = False
        try:
            asked = len(prefill.bodies)
            for part in (1, 2):
                body = {"model": MODEL, "messages": rag(f"What does part b{part} do?")}
                post(server, {**body, "max_tokens": 4})
        finally:
            prefill.prefill = True
        assert len(prefill.bodies) == asked + 1  # the first only
        assert decisions(server, "local", "no_params") == 1
        assert decisions(server, "local", "prefill_backoff") == 1
        assert "kv_transfer_params" not in decode.bodies[-1]


def test_a_busy_prefill_server_means_a_local_prefill(
    front: Server, decode: FakeUpstream, prefill: FakeUpstream
):
    """The prefill server's queue counts what its /metrics says is waiting (read at each
    health check): at --pd-max-prefill-queue (2) per server the decode server prefills."""
    admin = {"Authorization": f"Bearer {ADMIN}"}

    def prefill_waiting() -> int | None:
        servers = httpx.get(front.url + "/admin/upstreams", headers=admin).json()
        return next(s["waiting"] for s in servers if s["role"] == "prefill")

    prefill.waiting = 2
    try:
        until("the gateway reads the prefill queue", lambda: prefill_waiting() == 2, 15)
        asked, busy = len(prefill.bodies), decisions(front, "local", "prefill_busy")
        post(front, {"model": MODEL, "messages": rag("What does part 9 do?"), "max_tokens": 4})
        assert len(prefill.bodies) == asked
        assert "kv_transfer_params" not in decode.bodies[-1]
        assert decisions(front, "local", "prefill_busy") == busy + 1
    finally:
        prefill.waiting = 0
    until("the gateway reads the prefill queue", lambda: prefill_waiting() == 0, 15)


def test_ready_and_the_admin_view_show_both_pools_with_their_roles(
    front: Server, decode: FakeUpstream, prefill: FakeUpstream
):
    body = ready(front).json()
    assert body["upstreams"] == [
        {"name": decode.url, "up": True, "role": "decode"},
        {"name": prefill.url, "up": True, "role": "prefill"},
    ]
    servers = httpx.get(
        front.url + "/admin/upstreams", headers={"Authorization": f"Bearer {ADMIN}"}
    ).json()
    assert [(s["upstream"], s["role"], s["models"]) for s in servers] == [
        (decode.url, "decode", [MODEL]),
        (prefill.url, "prefill", [MODEL]),
    ]
    remote = decisions(front, "remote", "long_prompt")
    post(front, {"model": MODEL, "messages": rag("What does part v do?"), "max_tokens": 4})
    assert decisions(front, "remote", "long_prompt") == remote + 1  # a sample, not a header


def test_a_dead_prefill_server_means_local_prefills_and_ready_says_why(decode: FakeUpstream):
    dead = f"http://127.0.0.1:{free_port()}"
    with serving(Server(pd_flags(decode.url, dead))) as [server]:
        answer = ready(server)
        assert answer.status_code == 200  # the decode servers answer alone
        down = answer.json()["upstreams"][1]
        assert (down["name"], down["up"], down["role"]) == (dead, False, "prefill")
        assert "ConnectError" in down["detail"]
        body = {"model": MODEL, "messages": rag("What does part 5 do?"), "max_tokens": 4}
        post(server, body)
        assert "kv_transfer_params" not in decode.bodies[-1]
        assert decisions(server, "local", "prefill_down") == 1
        assert timings_of(post(server, body).headers["server-timing"]) == timings_of(SERVER_TIMING)


def cli_settings(*argv: str) -> Settings:
    return _settings(build_parser().parse_args(["serve", *argv]))


def test_prefill_servers_from_flags_the_environment_and_the_config_file(tmp_path: Path):
    flags = cli_settings(
        "--upstream", "llama=http://d:8000", "--upstream", "http://e:8000",
        "--upstream-prefill", "llama=http://p:8000,http://q:8000/",
        "--upstream-prefill", "http://r:8000", "--pd-min-prompt-tokens", "1000",
        "--pd-max-prefill-queue", "4", "--pd-prefill-timeout", "9",
    )  # fmt: skip
    assert flags.upstream_prefill_groups == {"llama": ["http://p:8000", "http://q:8000"]}
    assert flags.upstream_prefill == ["http://r:8000"]
    assert (flags.pd_min_prompt_tokens, flags.pd_max_prefill_queue) == (1000, 4)
    assert flags.pd_prefill_timeout == 9.0
    metrics = GatewayMetrics(lambda: None, lambda: None, lambda: None, list)
    for pair in build_upstream(flags, metrics).targets:  # the group's, the discovered ones'
        assert isinstance(pair, Disaggregated)
        assert (pair._timeout, pair.prefill._timeout) == (600.0, 9.0)
    env = {
        "SEMGATE_UPSTREAMS": "llama=http://d:8000",
        "SEMGATE_UPSTREAM_PREFILL": "llama=http://p:8000",
        "SEMGATE_PD_MIN_PROMPT_TOKENS": "256",
    }
    from_env = Settings.load(env=env)
    assert from_env.upstream_prefill_groups == {"llama": ["http://p:8000"]}
    assert from_env.pd_min_prompt_tokens == 256
    path = tmp_path / "semgate.toml"
    path.write_text(
        'upstreams = ["llama=http://d:8000"]\n[upstream_prefill]\nllama = ["http://p:8000"]\n'
    )
    assert Settings.load(path, env={}).upstream_prefill_groups == {"llama": ["http://p:8000"]}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--upstream-prefill", "qwen=http://p:8000"], "prefill servers for 'qwen', which no"),
        (["--upstream-prefill", "http://p:8000"], "need decode servers whose models"),
        (["--upstream-prefill", "llama=p:8000"], "is not an http.s. URL"),
        (["--pd-max-prefill-queue", "0"], "pd_max_prefill_queue must be >= 1"),
    ],
    ids=["no-decode-group", "no-discovered-decode", "bad-url", "no-queue"],
)
def test_prefill_servers_without_decode_servers_are_refused_at_start(argv: list[str], error: str):
    with pytest.raises(ValueError, match=error):
        cli_settings("--upstream", "llama=http://d:8000", *argv)

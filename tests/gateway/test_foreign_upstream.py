"""A gateway in front of a server that is not semgate, given as users write it: llama.cpp's
llama-server's ways (tests/gateway/fake_upstream.py with `llama`) behind
`--upstream http://host:port/v1`, the OpenAI and LiteLLM spelling, beside a server that
is down. Cache off: this is about the upstream, not the cache."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.fake_upstream import GGUF, MODEL, TOO_LONG, FakeUpstream
from tests.gateway.servers import Server, free_port, ready, serving
from tests.waiting import until


@pytest.fixture(scope="module")
def llama() -> Iterator[FakeUpstream]:
    with FakeUpstream(llama=True) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1/"


@pytest.fixture(scope="module")
def front(llama: FakeUpstream, dead_url: str) -> Iterator[Server]:
    with serving(Server(["--no-cache", "--upstream", f"{llama.url}/v1,{dead_url}"])) as [server]:
        yield server


def chat(front: Server, **kw: object) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}], **kw}
    return httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)


def test_ready_from_the_start_probe_and_says_why_the_other_is_not_used(
    front: Server, llama: FakeUpstream, dead_url: str
):
    """The /v1 form is the server's root, and a /ready that is not semgate's (llama-server's
    `{"status": "ok"}`) says alive: the models come from /v1/models. The probe made at
    start finds it up: the server says it is ready as it starts, not a health interval
    later (HttpUpstream.start; the line is logged just after /ready turns 200)."""
    until("the start-up log says ready", lambda: f"ready: {front.url}" in front.log())
    answer = ready(front)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["models"] == [MODEL]
    upstreams = {u["name"]: u for u in body["upstreams"]}
    assert upstreams[llama.url] == {"name": llama.url, "up": True}
    down = upstreams[dead_url.rstrip("/").removesuffix("/v1")]
    assert down["up"] is False and "ConnectError" in down["detail"]


def test_a_pass_through_names_the_model_asked_and_carries_the_clients_request_id(
    front: Server, llama: FakeUpstream
):
    """llama-server names its GGUF file in its answers; the client asked for the model the
    gateway lists. The server is sent the client's own X-Request-Id."""
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi?"}],
        "n": 2,  # passed through
    }
    for stream in (False, True):
        answer = httpx.post(
            front.url + "/v1/chat/completions",
            json={**body, "stream": stream},
            headers={"X-Request-Id": client_id},
            timeout=30,
        )
        assert answer.status_code == 200
        assert answer.headers["x-cache-bypass-reason"] == "n"
        assert answer.headers["x-request-id"] == client_id
        assert llama.request_ids[-1] == client_id
        assert GGUF not in answer.text
        if stream:
            assert answer.text.count(f'"model": "{MODEL}"') > 2
        else:
            assert answer.json()["model"] == MODEL


def test_a_miss_sends_the_request_id_and_passes_only_durations_in_server_timing(
    front: Server, llama: FakeUpstream
):
    """llama-server's `timings` count tokens and rates too: only its durations pass, as
    the engine's own phase names; the request id the server gets is the one answered."""
    answer = chat(front, temperature=0)
    assert answer.status_code == 200 and answer.headers["x-cache-status"] == "Bypass"
    assert answer.json()["model"] == MODEL
    assert answer.headers["server-timing"] == "prefill;dur=12.5, decode;dur=116.6"
    assert llama.request_ids[-1] == answer.headers["x-request-id"]
    streamed = chat(front, temperature=0, stream=True)
    assert streamed.headers.get("server-timing") is None  # nothing known as it starts
    assert '"timings":{"prefill":12.5,"decode":116.6}' in streamed.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": TOO_LONG}]},
         "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": TOO_LONG}], "n": 2},
         "messages"),
        ("/v1/completions", {"prompt": TOO_LONG}, "prompt"),
    ],
    ids=["miss", "pass-through", "text-completion"],
)  # fmt: skip
def test_a_prompt_over_the_context_is_refused_in_openais_words(
    front: Server, path: str, body: dict[str, object], param: str
):
    """llama-server's `exceed_context_size_error` passed through as it was, while the
    in-process engine says `context_length_exceeded`, which OpenAI's clients know."""
    answer = httpx.post(front.url + path, json={"model": MODEL, **body}, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == ("context_length_exceeded", param)
    assert "context size" in error["message"]


def test_a_json_pass_through_that_dies_mid_answer_is_a_502(front: Server, llama: FakeUpstream):
    """Runs last: the server is marked down until its next health check."""
    answer = chat(front, x_drop=True)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["type"] == "upstream_error"
    assert "retry-after" not in answer.headers


def test_a_model_named_by_an_absolute_path_can_be_retrieved():
    """llama-server's model id is its GGUF file's absolute path: GET /v1/models/{id} finds
    it, as the openai SDK asks (the slashes encoded) and as written by hand (a double
    slash); both lost the leading slash before."""
    with (
        FakeUpstream(models=(GGUF,), llama=True) as upstream,
        serving(Server(["--no-cache", "--upstream", upstream.url])) as [server],
    ):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve(GGUF).id == GGUF
        answer = httpx.get(f"{server.url}/v1/models/{GGUF}")
        assert answer.status_code == 200 and answer.json()["id"] == GGUF
        assert httpx.get(f"{server.url}/v1/models{GGUF}").status_code == 404

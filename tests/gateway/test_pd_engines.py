"""Prefill and decode apart, end to end: a gateway (`--upstream-prefill`) in front of a
real prefill engine server and a real decode engine server (`--kv-role prefill|decode`)
sharing a Redis Stack of their own as their KV store. A long prompt is prefilled on the
prefill server and loaded on the decode server, with the text a colocated engine gives; a
short one never touches the prefill server; a KV store killed, or a prefill server gone,
costs a local prefill, never a failed request or another text."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cache.redis_server import EmbeddedRedis
from tests.gateway.conftest import chat_body, timings_of
from tests.gateway.servers import MODEL, Server, metric, serving

pytestmark = pytest.mark.slow  # three servers of its own

ENGINE = ["--no-cache", "--num-threads", "1", "--max-model-len", "1024"]
MIN_PROMPT_TOKENS = 128
LONG = "Inventory: " + " ".join(f"crate {i} holds {i * 7 % 97} apples;" for i in range(50))
SHORT = "What is the capital of France?"
LOADED = f'semgate_kv_transfer_tokens_total{{model_name="{MODEL}",direction="loaded"}}'
SAVED = f'semgate_kv_transfer_tokens_total{{model_name="{MODEL}",direction="saved"}}'


def routed(route: str, reason: str) -> str:
    return f'semgate_pd_requests_total{{model_name="{MODEL}",route="{route}",reason="{reason}"}}'


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("kv-store"), persistent=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def servers(store: EmbeddedRedis) -> Iterator[tuple[Server, Server, Server]]:
    """The gateway, its prefill server and its decode server."""
    url = store.url
    prefill = Server([*ENGINE, "--kv-store", url, "--kv-role", "prefill"])
    decode = Server([*ENGINE, "--kv-store", url, "--kv-role", "decode"])
    gateway = Server(
        [
            "--no-cache",
            "--upstream", decode.url,
            "--upstream-prefill", prefill.url,
            "--pd-min-prompt-tokens", str(MIN_PROMPT_TOKENS),
        ]
    )  # fmt: skip
    with serving(prefill, decode, gateway) as [p, d, g]:
        yield g, p, d


def ask(server: Server, question: str) -> httpx.Response:
    body = chat_body(question, max_tokens=16)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def text_of(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def test_a_long_prompt_is_prefilled_remotely_and_loaded(
    servers: tuple[Server, Server, Server],
) -> None:
    gateway, prefill, decode = servers
    loaded, saved = metric(decode, LOADED, 0), metric(prefill, SAVED, 0)
    response = ask(gateway, LONG)
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    assert prompt_tokens > 400
    assert metric(gateway, routed("remote", "long_prompt")) == 1
    assert "pd-prefill" in timings_of(response.headers["server-timing"])
    # The decode server loaded every full block short of the prompt's last token.
    assert metric(decode, LOADED) - loaded == (prompt_tokens - 1) // 16 * 16
    assert metric(prefill, SAVED) - saved >= (prompt_tokens - 1) // 16 * 16
    assert metric(decode, SAVED, 0) == 0  # a decode server only loads
    # The text a colocated engine gives (the prefill server answering the request whole).
    assert text_of(response) == text_of(ask(prefill, LONG))


def test_a_short_prompt_never_touches_the_prefill_server(
    servers: tuple[Server, Server, Server],
) -> None:
    gateway, prefill, _ = servers
    before = metric(prefill, 'semgate_http_requests_total{path="/v1/chat/completions"}', 0)
    ask(gateway, SHORT)
    assert metric(gateway, routed("local", "short_prompt")) >= 1
    after = metric(prefill, 'semgate_http_requests_total{path="/v1/chat/completions"}', 0)
    assert after == before


def test_a_killed_store_costs_a_local_prefill_never_an_error(
    servers: tuple[Server, Server, Server], store: EmbeddedRedis
) -> None:
    """The store is killed (as if its Redis died mid-run): the prefill server cannot save,
    the decode server cannot load, and the answer is the one it computes itself."""
    gateway, prefill, decode = servers
    question = LONG.replace("apples", "plums")
    expected = text_of(ask(prefill, question))  # before the kill: computed, and saved
    store.stop()
    loaded = metric(decode, LOADED, 0)
    assert text_of(ask(gateway, question)) == expected
    assert metric(decode, LOADED, 0) == loaded  # nothing came from a dead store
    failures = f'semgate_kv_transfer_failures_total{{model_name="{MODEL}"}}'
    assert metric(decode, failures, 0) + metric(prefill, failures, 0) > 0


def test_a_prefill_server_that_is_gone_means_a_local_prefill(
    servers: tuple[Server, Server, Server],
) -> None:
    """The last test of the module: it stops the prefill server."""
    gateway, prefill, _ = servers
    expected = text_of(ask(prefill, LONG.replace("apples", "pears")))
    prefill.stop()
    response = ask(gateway, LONG.replace("apples", "pears"))
    assert text_of(response) == expected
    local = metric(gateway, routed("local", "prefill_failed"), 0)
    local += metric(gateway, routed("local", "prefill_down"), 0)
    assert local >= 1

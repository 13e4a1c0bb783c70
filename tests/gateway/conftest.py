"""Clients of the session's gateway (tests/gateway/fixtures.py) as alice, bob and the
admin, and the request helpers the HTTP tests share."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.fixtures import ADMIN, ALICE, BOB
from tests.gateway.servers import MODEL, Server, caching_server, serving
from tests.waiting import until

# An engine server (`semgate serve --no-cache`): what tests of the gateway's upstream
# mode put behind it. One thread, so that it and the gateway in front share the cores.
MAX_MODEL_LEN = 512
ENGINE_ARGS = ["--no-cache", "--num-threads", "1", "--max-model-len", str(MAX_MODEL_LEN)]


@pytest.fixture(scope="session")
def engine_process() -> Iterator[Server]:
    """Started, not waited for: a module can start its own servers while this one loads
    (`up` waits)."""
    server = Server(ENGINE_ARGS).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def speculating_process() -> Iterator[Server]:
    """A second engine server, one that speculates (n-gram lookup): lossless, so it gives
    the session engine's greedy answers. Started, not waited for."""
    server = Server([*ENGINE_ARGS, "--spec-method", "ngram", "--num-spec-tokens", "4"]).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def engine_pair(engine_process: Server, speculating_process: Server) -> list[Server]:
    """Two engine servers, up at the start of each module that uses them (a test may
    kill one: the last of its module, or one that starts it again)."""
    return [up(engine_process), up(speculating_process)]


def up(server: Server) -> Server:
    """`server` ready, started again first if a test killed it."""
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    return server.wait_ready()


@pytest.fixture(scope="module")
def engine_server(engine_process: Server) -> Server:
    """The session's engine server, up at the start of each module that uses it: a test
    that kills it (the last of its module) leaves it to be started again here."""
    return up(engine_process)


# The bounded gateway's engine bounds, its default max_tokens and context, and the keys
# of the tests that use it (alice's and the admin's as on the session's gateway).
MAX_NUM_SEQS, MAX_WAITING = 8, 4
DEFAULT_CAP, SMALL_CONTEXT = 12, 256
ADMISSION_KEY, FUZZ_KEY = "sk-admission", "sk-fuzz"


@pytest.fixture(scope="session")
def bounded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second cache-on gateway (one engine thread), bounded: 8 running slots and 4
    places in the queue (tests/gateway/test_admission.py), a default max_tokens of 12
    and a 256-token context (test_default_max_tokens.py); and free to change: the fuzzer
    of test_openapi.py (the last of them to run) sets thresholds and flushes the cache,
    and its probes without a key, from one address, are past 60 a minute."""
    keys = f"{ADMISSION_KEY}:admission,{FUZZ_KEY}:fuzz,{ALICE}:alice"
    flags = [
        "--num-threads", "1", "--api-keys", keys, "--admin-key", ADMIN,
        "--failed-auth-rate-limit", "100000/minute",
        "--max-num-seqs", str(MAX_NUM_SEQS), "--max-waiting", str(MAX_WAITING),
        "--default-max-tokens", str(DEFAULT_CAP), "--max-model-len", str(SMALL_CONTEXT),
    ]  # fmt: skip
    with serving(caching_server(tmp_path_factory, flags)) as [server]:
        yield server


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeUpstream]:
    """The fake OpenAI-compatible server (tests/gateway/fake_upstream.py): tests compare
    what it received since they began (every module that forwards to it adds to it)."""
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="session")
def fake_front(fake: FakeUpstream) -> Iterator[Server]:
    """A gateway in front of `fake` alone, cache off, and the admin API off: an empty
    SEMGATE_ADMIN_KEY (what compose passes when it is unset: tests/gateway/test_admin_key.py)."""
    server = Server(["--upstream", fake.url, "--no-cache"], env={"SEMGATE_ADMIN_KEY": ""})
    with serving(server):
        yield server


@pytest.fixture(scope="session")
def alice(gateway: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0)


@pytest.fixture(scope="session")
def bob(gateway: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=BOB, max_retries=0)


def client_of(server: Server, key: str, timeout: float = 120) -> httpx.Client:
    """Raw HTTP to `server` with `key` as the bearer token."""
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout
    )


@pytest.fixture
def admin(gateway: Server) -> Iterator[httpx.Client]:
    with client_of(gateway, ADMIN, timeout=60) as client:
        yield client


@pytest.fixture
def http(gateway: Server) -> Iterator[httpx.Client]:
    """Raw HTTP as alice, for what the SDK hides (headers, framing, error bodies)."""
    with client_of(gateway, ALICE) as client:
        yield client


def settle(url: str | httpx.URL, timeout: float = 10) -> None:
    """Waits until the gateway at `url` (its root, or a client's base URL: an OpenAI
    client's ends in /v1) has no answer in flight or being stored: answers are stored
    just after their response ends, so a test that asks again at once would otherwise
    race the store (and follow the finished flight instead of hitting)."""
    root = str(url).rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {ADMIN}"}

    def settled() -> bool:
        stats = httpx.get(root + "/admin/cache/stats", headers=headers).json()
        return stats["in_flight"] == 0 and stats["pending_stores"] == 0

    until("the gateway has no answer in flight", settled, timeout)


@pytest.fixture
def fresh(admin: httpx.Client) -> None:
    """Starts a test with alice's and bob's cache entries flushed."""
    for tenant in ("alice", "bob"):
        admin.delete("/admin/cache", params={"tenant": tenant}).raise_for_status()


# Keeps the small model's answers short, so they end with "stop" within max_tokens.
SYSTEM = "Answer in one short sentence."


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def seed(admin: httpx.Client, question: str, answer: str, tenant: str, **kw: object) -> dict:
    """Seeds an answer to `question` as asked after SYSTEM (as `messages` asks it): the
    entry as the admin API returns it."""
    body = {
        "question": question,
        "answer": answer,
        "tenant": tenant,
        "context": [{"role": "system", "content": SYSTEM}],
        **kw,
    }
    seeded = admin.post("/admin/cache/entries", json=body)
    assert seeded.status_code == 201, seeded.text
    return seeded.json()


def chat_body(question: str, **kw: object) -> dict[str, Any]:
    """A greedy chat request for `question`: a JSON body, or the SDK's keyword arguments."""
    return {
        "model": MODEL,
        "messages": messages(question),
        "temperature": 0,
        "max_tokens": 96,
        **kw,
    }


def timings_of(header: str) -> dict[str, float]:
    """A Server-Timing header as the gateway writes it (`name;dur=1.2, ...`, checked
    strictly): milliseconds by name, in order."""
    timings = {}
    for entry in header.split(", "):
        match = re.fullmatch(r"([a-z-]+);dur=(\d+\.\d)", entry)
        assert match, header
        timings[match[1]] = float(match[2])
    return timings

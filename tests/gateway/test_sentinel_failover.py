"""The cache behind Redis Sentinel, through a real `semgate serve`: a gateway given
`--redis-url redis+sentinel://...` (the session's cluster: tests/redis_sentinel.py) in
front of the fake upstream, its primary SIGKILLed while questions keep coming. Every
answer is a 200 meanwhile (uncached while no primary answers), the same question is a
hit again once Sentinel has promoted the replica (the entry was replicated before the
kill), and the gateway says it followed the failover."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.gateway.conftest import ADMIN, settle
from tests.gateway.fake_upstream import MODEL, FakeUpstream
from tests.gateway.servers import Server, ready, serving
from tests.redis_sentinel import PASSWORD, SentinelCluster

# The goal: the same question is a hit again within 30 s of the primary's death.
HIT_AGAIN_WITHIN = 30.0


@pytest.fixture(scope="module")
def gateway(fake: FakeUpstream, sentinel_cluster: SentinelCluster) -> Iterator[Server]:
    flags = ["--upstream", fake.url, "--redis-url", sentinel_cluster.url(), "--admin-key", ADMIN]
    with serving(Server(flags)) as [server]:
        yield server
    server.log_path.unlink()


def ask(gateway: Server, question: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)


def test_the_cache_follows_a_failover_without_an_error(
    gateway: Server, sentinel: SentinelCluster
) -> None:
    question = "Which node is the primary now?"
    assert ask(gateway, question).headers["x-cache-status"] == "Miss"
    settle(gateway.url)
    assert ask(gateway, question).headers["x-cache-status"] == "Hit"
    sentinel.replicated()
    dead = sentinel.primary()

    dead.kill()
    killed = time.monotonic()
    statuses = []
    while time.monotonic() - killed < HIT_AGAIN_WITHIN:
        answer = ask(gateway, question)
        assert answer.status_code == 200, answer.text
        statuses.append(answer.headers["x-cache-status"])
        if statuses[-1] == "Hit":
            break
    seconds = time.monotonic() - killed
    print(f"hit again {seconds:.1f} s after the primary's SIGKILL ({len(statuses)} requests)")
    assert statuses[-1] == "Hit", f"no hit within {HIT_AGAIN_WITHIN:.0f} s: {statuses}"
    assert set(statuses[:-1]) <= {"Miss", "Bypass"} and statuses[:-1], statuses  # a gap

    assert sentinel.primary() is not dead
    assert ready(gateway).json()["cache"] == "up"
    log = gateway.log_path.read_text()
    assert f"(was 127.0.0.1:{dead.port})" in log and "Redis Sentinel failed over" in log
    assert quote(PASSWORD, safe="") not in log and "internal error" not in log
    # The new primary takes writes: a new answer is stored, and found.
    assert ask(gateway, "And after the failover?").headers["x-cache-status"] == "Miss"
    settle(gateway.url)
    assert ask(gateway, "And after the failover?").headers["x-cache-status"] == "Hit"

"""Two gateway replicas sharing one Redis, as behind a load balancer: an answer stored
through one is a hit on the other, and the same question asked of both at once runs
on one engine only, streamed live to the other replica's client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from cache import EmbeddedRedis
from tests.gateway.conftest import ADMIN, chat_body, settle
from tests.gateway.servers import Server, serving

pytestmark = pytest.mark.slow  # starts two servers of its own


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    redis = EmbeddedRedis(Path(tmp_path_factory.mktemp("shared-redis")))
    redis.start()
    args = ["--redis-url", redis.url, "--admin-key", ADMIN, "--num-threads", "1"]
    try:
        with serving(Server(args), Server(args)) as [first, second]:
            yield first, second
    finally:
        redis.stop()


def post(server: Server, question: str, **kw: object) -> httpx.Response:
    body = chat_body(question, **kw)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def test_an_answer_stored_by_one_replica_is_a_hit_on_the_other(replicas: tuple[Server, Server]):
    first = post(replicas[0], "What is the chemical symbol for gold?")
    assert first.headers["x-cache-status"] == "Miss"
    settle(replicas[0].url)
    second = post(replicas[1], "Which chemical symbol does gold have?")
    assert second.headers["x-cache-status"] == "Hit"
    assert (
        second.json()["choices"][0]["message"]["content"]
        == (first.json()["choices"][0]["message"]["content"])
    )


def test_the_same_question_at_both_replicas_runs_once(replicas: tuple[Server, Server]):
    results: dict[int, httpx.Response] = {}
    start = threading.Barrier(2)

    def ask(i: int) -> None:
        start.wait()
        results[i] = post(replicas[i], "Describe the water cycle.", max_tokens=64)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = {results[i].headers["x-cache-status"] for i in range(2)}
    coalesced = [results[i].headers.get("x-cache-coalesced") for i in range(2)]
    assert statuses == {"Miss"}
    assert sorted(c or "" for c in coalesced) == ["", "true"]  # one led, one followed
    texts = {results[i].json()["choices"][0]["message"]["content"] for i in range(2)}
    assert len(texts) == 1
    # Either replica's stats add up both (each publishes its own twice a second).
    stats = until("both replicas' counts", lambda: admin(replicas[0], "get", "/cache/stats"),
                  lambda s: s["replicas"] == 2 and s["coalesced_remote"] == 1)  # fmt: skip
    assert stats["lookups"] >= 2


def admin(server: Server, method: str, path: str, **kw: object) -> dict:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    response = httpx.request(method, f"{server.url}/admin{path}", headers=headers, **kw)
    assert response.status_code == 200, response.text
    return response.json()


def until(what: str, get: Callable[[], dict], done: Callable[[dict], bool]) -> dict:
    deadline = time.monotonic() + 10
    while not done(value := get()):
        assert time.monotonic() < deadline, f"not within 10 s: {what} ({value})"
        time.sleep(0.1)
    return value


def test_a_threshold_set_on_one_replica_applies_on_the_other(replicas: tuple[Server, Server]):
    change = {"default": 0.87, "per_tenant": {"strict": 0.99}}
    changed = admin(replicas[0], "put", "/cache/threshold", json=change)
    assert changed["default"] == 0.87
    seen = until("the other replica applies it",
                 lambda: admin(replicas[1], "get", "/cache/threshold"),
                 lambda t: t == changed)  # fmt: skip
    assert seen["per_tenant"] == {"strict": 0.99}

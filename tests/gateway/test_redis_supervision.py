"""The cache's Redis under supervision, and readiness that means "chat is answered".

On real `semgate serve` processes: the embedded Redis is SIGKILLed by its pid and must
be reaped, restarted with its data and reconnected to, while /ready stays 200 and says
"down" then "up" and the admin API answers 503 saying why; a gateway whose --redis-url
answers nothing is ready and answers chat uncached. An external Redis is PINGed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from cache import EmbeddedRedis
from cache.supervisor import RedisSupervisor
from tests.gateway.conftest import ADMIN, chat_body, client_of, settle
from tests.gateway.servers import Server, caching_server, free_port, metric, ready, serving
from tests.waiting import until, until_async

pytestmark = pytest.mark.slow  # starts two gateways of its own

ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
# The embedded-Redis gateway's circuit breaker back-off (cache_breaker_backoff, 5 s by
# default), shorter so that its outages end sooner.
BACKOFF = 3


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, engine_server: Server
) -> Iterator[tuple[Server, Server]]:
    """An embedded-Redis gateway, and one pointed at a port where nothing listens; both
    in front of the session's engine server (what answers misses is not what is tested
    here: no model of their own to load)."""
    flags = ["--admin-key", ADMIN, "--upstream", engine_server.url]
    embedded = caching_server(tmp_path_factory, flags)
    embedded.env["SEMGATE_CACHE_BREAKER_BACKOFF"] = str(BACKOFF)
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    unreachable = Server(
        ["--redis-url", nowhere, *flags],
        wait_for_cache=False,  # it never comes up
    )
    with serving(embedded, unreachable):
        yield embedded, unreachable


def ask(server: Server, question: str, **kw: object) -> httpx.Response:
    body = chat_body(question, **kw)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def embedded_redis(server: Server) -> tuple[int, int]:
    """The pid and port of the gateway's redis-server child (each thread lists the
    children it started). Redis retitles itself `<path>/redis-server 127.0.0.1:<port>`."""
    assert server.proc is not None
    tasks = Path(f"/proc/{server.proc.pid}/task")
    for pid in (int(p) for f in tasks.glob("*/children") for p in f.read_text().split()):
        with contextlib.suppress(FileNotFoundError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "redis-server":
                title = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
                port = re.search(r"127\.0\.0\.1:(\d+)", title)
                assert port is not None, title
                return pid, int(port[1])
    raise AssertionError("the gateway has no redis-server child")


def squat(port: int, timeout: float = 10) -> socket.socket:
    """Listens on the dead server's port, so that restarts fail until it is closed: the
    outage lasts as long as the test needs. Redis binds it again with SO_REUSEADDR;
    so does this, past the old connections' TIME_WAIT."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def test_the_start_up_log_says_how_long_each_piece_of_the_cache_took(
    servers: tuple[Server, Server],
):
    gateway = servers[0]
    pieces = ("Redis", "embedder", "multilingual embedder", "cross-encoder")
    took = ", ".join(rf"{name} \d+\.\d\d s" for name in pieces)
    started = rf"cache ready in \d+\.\d s \({took}\): embedded Redis Stack at redis://"
    assert re.search(started, gateway.log_path.read_text()), gateway.log()
    weights = r"multilingual embedder's weights loaded in \d+\.\d\d s"
    until("the weights are loaded", lambda: bool(re.search(weights, gateway.log_path.read_text())))


def test_a_killed_embedded_redis_is_restarted_with_its_data(servers: tuple[Server, Server]):
    gateway = servers[0]
    admin = client_of(gateway, ADMIN, timeout=30)
    assert ready(gateway).json()["cache"] == "up"
    assert metric(gateway, "semgate_cache_up") == 1
    assert metric(gateway, "semgate_cache_redis_restarts_total") == 0
    seed = {"question": "What is the gateway's motto?", "answer": "Cache first, ask later."}
    seeded = admin.post("/admin/cache/entries", json=seed)
    assert seeded.status_code == 201, seeded.text
    entry = seeded.json()["id"]
    question = "Name a primary colour."
    assert ask(gateway, question).headers["x-cache-status"] == "Miss"
    settle(gateway.url)
    assert ask(gateway, question).headers["x-cache-status"] == "Hit"

    pid, port = embedded_redis(gateway)
    os.kill(pid, signal.SIGKILL)
    with squat(port):
        until("cache down", lambda: ready(gateway).json()["cache"] == "down")
        down = ready(gateway)
        assert down.status_code == 200  # chat is still answered
        assert "SIGKILL" in down.json()["cache_detail"]
        assert metric(gateway, "semgate_cache_up") == 0
        for refused in (
            admin.get(f"/admin/cache/entries/{entry}"),
            admin.post("/admin/cache/entries", json=seed),
            admin.get("/admin/cache/stats"),
        ):
            assert refused.status_code == 503, refused.text
            message = refused.json()["error"]["message"]
            assert "Redis is down" in message and "restarted" in message
            assert refused.headers["retry-after"]
        # Reaped at once: no zombie, however long the outage lasts.
        assert not Path(f"/proc/{pid}").exists()
        # Answered uncached, without asking the cache (nor logging a failed lookup).
        uncached = ask(gateway, "Say hello.", max_tokens=4)
        assert uncached.headers["x-cache-status"] == "Bypass"
        assert "cache lookup failed open" not in gateway.log()
        # A restart on the taken port fails, and is tried again later (backoff).
        until("a failed restart", lambda: "embedded Redis did not restart" in gateway.log())
        assert ready(gateway).json()["cache"] == "down"

    until("cache up again", lambda: ready(gateway).json()["cache"] == "up")
    assert metric(gateway, "semgate_cache_up") == 1
    assert metric(gateway, "semgate_cache_redis_restarts_total") == 1
    new_pid, new_port = embedded_redis(gateway)
    assert new_pid != pid and new_port == port
    # The append-only file brought the entries back; the clients reconnected.
    assert admin.get(f"/admin/cache/entries/{entry}").json()["answer"] == seed["answer"]
    hit = ask(gateway, seed["question"], messages=[{"role": "user", "content": seed["question"]}])
    assert (hit.headers["x-cache-status"], hit.headers["x-cache-entry"]) == ("Hit", entry)
    assert ask(gateway, question).headers["x-cache-status"] == "Hit"
    log = gateway.log()
    assert f"embedded Redis (pid {pid}) exited (killed by SIGKILL)" in log
    assert "restart 1" in log


def test_a_paused_redis_is_skipped_by_the_circuit_breaker(servers: tuple[Server, Server]):
    """`kill -STOP` of the embedded Redis: it neither exits nor refuses, so only timeouts
    tell. The admin API answers 503 (it gave 500s), three lookups in a row time out and
    the breaker opens: chat then skips the cache (it paid the 1 s lookup timeout on
    every request), and /ready and /metrics say so. After SIGCONT the next probe closes
    it."""
    gateway = servers[0]
    admin = client_of(gateway, ADMIN, timeout=30)
    assert ready(gateway).json()["cache"] == "up"
    pid, _ = embedded_redis(gateway)
    os.kill(pid, signal.SIGSTOP)
    try:
        # Before the breaker opens, each call waits for its Redis command to time out.
        for refused in (
            admin.get("/admin/cache/entries"),
            admin.put("/admin/cache/threshold", json={"default": 0.7}),
        ):
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "cache_unavailable"
        statuses = [ask(gateway, f"Say {i}.", max_tokens=2).headers["x-cache-status"]
                    for i in range(5)]  # fmt: skip
        assert statuses == ["Miss"] * 3 + ["Bypass"] * 2, statuses  # failed open, then skipped
        down = ready(gateway)
        assert down.status_code == 200 and down.json()["cache"] == "down"
        assert "Redis is not answering" in down.json()["cache_detail"]
        assert metric(gateway, "semgate_cache_circuit_open") == 1
        assert metric(gateway, "semgate_cache_up") == 0
        for refused in (
            admin.get("/admin/cache/entries"),
            admin.delete("/admin/cache", params={"tenant": "default"}),
            admin.get("/admin/cache/stats"),
        ):
            assert refused.status_code == 503, refused.text
    finally:
        os.kill(pid, signal.SIGCONT)
    until("cache up again", lambda: ask(gateway, "Say ok.", max_tokens=2).headers[
        "x-cache-status"] == "Miss" and ready(gateway).json()["cache"] == "up")  # fmt: skip
    assert metric(gateway, "semgate_cache_circuit_open") == 0
    assert metric(gateway, "semgate_cache_circuit_opens_total") == 1
    assert "internal error" not in gateway.log()


def test_the_cache_is_back_soon_after_a_long_hang(servers: tuple[Server, Server]):
    """A hang long enough for two failed probes, chat asked all along (its lookups are the
    breaker's probes): at its end the cache is skipped for at most one back-off more
    (doubling back-offs had skipped it for twice that by then, and kept it off 12 s after
    the issue's 30 s hang); then the next probe finds Redis. The breaker's arithmetic
    over long outages is tests/resilience/test_circuit_breaker.py's."""
    gateway = servers[0]
    until("cache up", lambda: ready(gateway).json()["cache"] == "up")
    pid, _ = embedded_redis(gateway)
    asked = 0
    # Lookups time out after 1 s: 3 open the breaker, a probe fails at about BACKOFF + 4 s.
    hang = 3 * BACKOFF
    os.kill(pid, signal.SIGSTOP)
    try:
        hang_ends = time.monotonic() + hang
        while time.monotonic() < hang_ends:
            ask(gateway, f"Count to {asked}.", max_tokens=1)
            asked += 1
        detail = ready(gateway).json()["cache_detail"]
    finally:
        os.kill(pid, signal.SIGCONT)
    skipped = re.search(r"tried again in (\d+) s", detail)
    assert skipped is not None, detail
    assert int(skipped[1]) <= BACKOFF, detail

    def answered_from_the_cache() -> bool:
        nonlocal asked
        asked += 1
        answer = ask(gateway, f"Count to {asked}.", max_tokens=1)
        return answer.headers["x-cache-status"] != "Bypass"

    until("the cache is back", answered_from_the_cache)


def test_an_unreachable_redis_url_leaves_chat_ready_and_uncached(
    servers: tuple[Server, Server],
):
    gateway = servers[1]
    answer = ready(gateway)
    assert answer.status_code == 200, answer.text
    assert answer.json()["cache"] == "down"
    assert "cache start failed" in answer.json()["cache_detail"]
    assert metric(gateway, "semgate_cache_up") == 0
    chat = ask(gateway, "Say yes.", max_tokens=4)
    assert chat.headers["x-cache-status"] == "Bypass"
    refused = httpx.get(gateway.url + "/admin/cache/stats", headers=ADMIN_HEADERS)
    assert refused.status_code == 503
    assert "not ready yet" in refused.json()["error"]["message"]
    # The models load once Redis is up: no attempt loaded them in vain.
    assert "multilingual embedder's weights" not in gateway.log_path.read_text()


def test_an_external_redis_is_pinged(tmp_path: Path):
    """Not the supervisor's to restart: its state follows PINGs (here, a test-owned
    Redis killed, then restarted by the test)."""
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()

    async def watch() -> None:
        client = aioredis.Redis.from_url(server.url, socket_timeout=2)
        supervisor = RedisSupervisor(client)
        supervisor.start()

        try:
            assert server.pid is not None
            os.kill(server.pid, signal.SIGKILL)
            await until_async("it is down", lambda: not supervisor.up)
            assert "no answer to PING" in (supervisor.down_reason or "")
            await asyncio.to_thread(server.restart)
            await until_async("it is up again", lambda: supervisor.up)
            assert supervisor.down_reason is None and supervisor.restarts == 0
        finally:
            await supervisor.stop()
            await client.aclose()

    try:
        asyncio.run(watch())
    finally:
        server.stop()

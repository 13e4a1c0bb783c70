"""The engine core under supervision (gateway/upstream/core_supervisor.py), on a `semgate
serve` of its own (cache on, one engine thread, a 3 s hang timeout): the core is killed
(`kill -9`) and stopped (`kill -STOP`) by its pid, as the issue's reproductions did.

Each time the requests it held end cleanly, /ready turns 503 saying why while /health
stays 200, cached answers are still served, the gauges read 0, and the core comes back
and is counted in /metrics."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import chat_body
from tests.gateway.servers import Server, caching_server, metric, ready, serving
from tests.waiting import until

pytestmark = pytest.mark.slow  # starts a server of its own

KEY, ADMIN_KEY = "sk-supervised", "sk-admin-supervised"
HEADERS = {"Authorization": f"Bearer {KEY}"}
HANG_TIMEOUT = 3
SEED = {"question": "What does the supervisor do?", "answer": "It restarts the core.",
        "tenant": "supervised"}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = [
        "--api-keys", f"{KEY}:supervised",
        "--admin-key", ADMIN_KEY,
        "--num-threads", "1",
        "--hang-timeout", str(HANG_TIMEOUT),
    ]  # fmt: skip
    with serving(caching_server(tmp_path_factory, flags)) as (server,):
        seeded = httpx.post(
            server.url + "/admin/cache/entries",
            json=SEED,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=60,
        )
        assert seeded.status_code == 201, seeded.text
        yield server


def core_pid(server: Server) -> int:
    """The engine core: the gateway's child running engine.core_process (each thread
    lists the children it started)."""
    assert server.proc is not None
    tasks = Path(f"/proc/{server.proc.pid}/task")
    children = [int(p) for f in tasks.glob("*/children") for p in f.read_text().split()]
    (pid,) = [p for p in children if b"core_process" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


def niceness(pid: int) -> set[int]:
    """The nice value of each of the process's threads (field 19 of /proc/.../stat)."""
    stats = Path(f"/proc/{pid}/task").glob("*/stat")
    return {int(stat.read_text().rsplit(")", 1)[1].split()[16]) for stat in stats}


def test_the_core_runs_niced_so_the_gateway_goes_first(server: Server):
    """Every thread of the core (torch's among them) at --engine-nice's default, the
    gateway's own at 0: when the CPU is full, lookups and HTTP go before engine steps."""
    assert server.proc is not None
    assert niceness(core_pid(server)) == {10}
    assert niceness(server.proc.pid) == {0}


def ask(server: Server, question: str, **kw: object) -> httpx.Response:
    body = chat_body(question, **kw) | {"messages": [{"role": "user", "content": question}]}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=60)


def events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_a_killed_core_is_restarted_and_hits_are_served_meanwhile(server: Server):
    assert ask(server, SEED["question"]).headers["x-cache-status"] == "Hit"
    body = chat_body("Tell a long story.", max_tokens=2000, stream=True, ignore_eos=True)
    headers = HEADERS | {"Cache-Control": "no-store"}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(6)]  # it runs: the core holds it
        until("the stream counted", lambda: metric(server, "semgate_num_requests_running") == 1)
        pid = core_pid(server)
        os.kill(pid, signal.SIGKILL)
        seen = [line for line in [*seen, *lines] if line]
    # The stream that was running ends with an error event and [DONE], not a cut.
    assert seen[-1] == "data: [DONE]", seen[-3:]
    error = events(seen)[-1]["error"]
    assert error["code"] == "engine_unavailable"
    assert "engine process exited (code -9)" in error["message"]

    until("unready", lambda: ready(server).status_code == 503)
    hit = ask(server, SEED["question"])  # the cache answers while the core is down
    miss = ask(server, "Name a river.")
    down = ready(server)
    assert (hit.status_code, hit.headers["x-cache-status"]) == (200, "Hit"), hit.text
    if down.status_code == 503:  # the core was down throughout: only misses are refused
        assert "restarting the engine core" in down.json()["error"]["message"]
        assert miss.status_code == 503 and miss.json()["error"]["code"] == "engine_unavailable"
        assert int(miss.headers["retry-after"]) >= 1
        assert metric(server, "semgate_num_requests_running") == 0  # reset, not the dead one's
        assert metric(server, 'semgate_upstream_up{upstream="in-process"}') == 0
    assert httpx.get(server.url + "/health").status_code == 200  # the process is fine

    until("ready again", lambda: ready(server).status_code == 200)
    assert not Path(f"/proc/{pid}").exists()  # reaped
    assert core_pid(server) != pid
    assert metric(server, 'semgate_engine_core_restarts_total{cause="exited"}') == 1
    answered = ask(server, "Name a river.", max_tokens=8)
    assert (answered.status_code, answered.headers["x-cache-status"]) == (200, "Miss")
    assert "Traceback" not in server.log()


def test_a_stopped_core_counts_as_hung_and_is_restarted(server: Server):
    """`kill -STOP`: a request waits at most the hang timeout, then gets a 503; /ready
    turns 503 and the core is killed and started again (the issue's request hung for
    the 30 s of the stop, with /ready 200 throughout)."""
    pid = core_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        stuck = ask(server, "Name a mountain.", max_tokens=8)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed and reaped by then
            os.kill(pid, signal.SIGCONT)
    assert stuck.status_code == 503, stuck.text
    error = stuck.json()["error"]
    assert error["code"] == "engine_unavailable"
    assert f"made no progress for {HANG_TIMEOUT} s (hung)" in error["message"]
    until("ready again", lambda: ready(server).status_code == 200)
    assert not Path(f"/proc/{pid}").exists()
    assert metric(server, 'semgate_engine_core_restarts_total{cause="hung"}') == 1
    assert ask(server, "Name a mountain.", max_tokens=8).status_code == 200
    log = server.log()
    assert f"made no progress for {HANG_TIMEOUT} s (hung): killing it" in log
    assert "Traceback" not in log


def test_an_idle_stopped_core_is_found_hung_without_a_request(server: Server):
    """`kill -STOP` of an idle core: its probes go unanswered, so /ready turns 503 within
    the hang timeout (and a probe's second) and the core is restarted, with no request
    sent (idle, it stayed ready until a request had waited out the whole timeout)."""
    until("ready", lambda: ready(server).status_code == 200)
    hung = metric(server, 'semgate_engine_core_restarts_total{cause="hung"}', missing=0)
    pid = core_pid(server)
    restarts = 'semgate_engine_core_restarts_total{cause="hung"}'
    os.kill(pid, signal.SIGSTOP)
    try:
        until("unready", lambda: ready(server).status_code == 503, HANG_TIMEOUT + 3)
        # Stopped until restarted: /ready turns 503 as the watchdog's check would kill it,
        # and a core let go on before the watchdog's next poll would answer its probe.
        until("restarted as hung", lambda: metric(server, restarts, missing=0) == hung + 1)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed and reaped by then
            os.kill(pid, signal.SIGCONT)
    until("ready again", lambda: ready(server).status_code == 200)
    assert metric(server, restarts) == hung + 1
    assert ask(server, "Name a lake.", max_tokens=8).status_code == 200
    assert "Traceback" not in server.log()

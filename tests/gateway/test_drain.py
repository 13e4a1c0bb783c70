"""A shutdown that drains (gateway/drain.py), on two `semgate serve` processes of their
own (cache off), each sent SIGTERM with five streams in flight: one whose grace is too
short for them, one whose grace lets them finish. The issue's streams were cut 5 s after
the signal, with no error event and no [DONE], and logged tracebacks."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import chat_body
from tests.gateway.servers import Server, metric, serving
from tests.waiting import until

pytestmark = pytest.mark.slow  # starts two servers of their own

SHORT_GRACE, LONG_GRACE = 2, 120
ARGS = ["--no-cache", "--num-threads", "1"]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    short = Server([*ARGS, "--shutdown-grace", str(SHORT_GRACE)])
    long = Server([*ARGS, "--shutdown-grace", str(LONG_GRACE)])
    with serving(short, long):
        yield short, long


class Streams:
    """`n` streamed answers read on threads, each line kept; `started` once every one
    has its first content chunk."""

    def __init__(self, server: Server, n: int, max_tokens: int) -> None:
        self.lines: list[list[str]] = [[] for _ in range(n)]
        self._content = [threading.Event() for _ in range(n)]
        body = chat_body("Tell a story.", max_tokens=max_tokens, stream=True, ignore_eos=True)
        self.threads = [
            threading.Thread(target=self._read, args=(server, body, i)) for i in range(n)
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, server: Server, body: dict[str, object], i: int) -> None:
        url = server.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    self.lines[i].append(line)
                if len(self.lines[i]) == 2:
                    self._content[i].set()

    def started(self, timeout: float = 60) -> bool:
        return all(event.wait(timeout) for event in self._content)

    def ended(self) -> list[bool]:
        """Which streams have their [DONE] already."""
        return [bool(lines) and lines[-1] == "data: [DONE]" for lines in self.lines]

    def join(self) -> list[list[dict[str, Any]]]:
        """Each stream's events once it has ended (every stream ends with [DONE])."""
        for thread in self.threads:
            thread.join(120)
        for lines in self.lines:
            assert lines[-1] == "data: [DONE]", lines[-3:]
        return [[json.loads(line[6:]) for line in lines[:-1]] for lines in self.lines]


def in_engine(server: Server) -> float:
    """The requests the engine holds, running or waiting."""
    return metric(server, "semgate_num_requests_running") + metric(
        server, "semgate_num_requests_waiting"
    )


def listening(server: Server) -> bool:
    try:
        httpx.get(server.url + "/health", timeout=5)
    except httpx.TransportError:
        return False
    return True


def exited(server: Server, timeout: float = 60) -> int:
    assert server.proc is not None
    return server.proc.wait(timeout)


def test_streams_still_running_at_the_grace_end_with_an_error_and_done(
    servers: tuple[Server, Server],
):
    server = servers[0]
    streams = Streams(server, 5, max_tokens=4000)
    assert streams.started()
    json_answer: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: json_answer.append(
            httpx.post(
                server.url + "/v1/chat/completions",
                json=chat_body("Count.", max_tokens=4000, ignore_eos=True),
                timeout=120,
            )
        )
    )
    waiting.start()
    until("the JSON request is in the engine beside the streams", lambda: in_engine(server) == 6)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    until("the server stops listening", lambda: not listening(server))
    assert not any(streams.ended()), "the streams ended before the grace did"
    for events in streams.join():
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        error = events[-1]["error"]
        assert error["code"] == "engine_unavailable"
        assert "the server is shutting down" in error["message"]
    waiting.join(60)
    assert json_answer[0].status_code == 503
    assert "the server is shutting down" in json_answer[0].json()["error"]["message"]
    assert exited(server) == -signal.SIGTERM  # uvicorn ends by the signal it was sent
    log = server.log()
    assert f"requests in flight have {SHORT_GRACE} s to finish" in log
    assert "ending the requests still in flight" in log
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log


def test_streams_that_finish_within_the_grace_are_answered_whole(
    servers: tuple[Server, Server],
):
    server = servers[1]
    streams = Streams(server, 5, max_tokens=40)
    assert streams.started()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    for events in streams.join():
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert not any("error" in event for event in events)
    assert exited(server) == -signal.SIGTERM
    log = server.log()
    assert "ending the requests still in flight" not in log
    assert "Traceback" not in log

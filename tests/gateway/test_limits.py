"""Per-key rate limits, the bounded engine queue and readiness, on a second gateway (cache
off, one engine slot, no waiting room, 3 requests a minute per key), and the failed-auth
limit on an open gateway without rate limits. A dead engine core:
tests/gateway/test_core_supervision.py."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from gateway.settings import Settings, parse_rate
from tests.gateway.conftest import chat_body
from tests.gateway.fake_upstream import MODEL as FAKE_MODEL
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import Server, serving
from tests.waiting import until

pytestmark = pytest.mark.slow  # starts a server of its own

KEYS = {"sk-limited": "t1", "sk-queue": "t2", "sk-other": "t3", "sk-fresh": "t4", "sk-logs": "t5"}
ADMIN_KEY = "sk-admin-limited"


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    server = Server(
        [
            "--no-cache",
            "--max-num-seqs", "1",
            "--max-waiting", "0",
            "--num-threads", "1",
            "--rate-limit", "3/minute",
            "--admin-key", ADMIN_KEY,
            "--admin-rate-limit", "5/minute",
            "--log-format", "json",
            "--api-keys", ",".join(f"{k}:{t}" for k, t in KEYS.items()),
        ],
        env={"TZ": "Asia/Kolkata"},  # local time is not UTC: the JSON log must say UTC
    )  # fmt: skip
    with serving(server):
        yield server


def failed_auth_budget() -> int:
    """What an address may send with a missing or unknown key a minute, by default."""
    rate = parse_rate(Settings.failed_auth_rate_limit)
    assert rate is not None and rate[0] == "minute"
    return rate[1]


def post(server: Server, key: str, **kw: object) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json=chat_body("Say yes.", max_tokens=4, **kw),
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def test_ready_is_503_until_the_model_is_loaded(limited: Server):
    assert limited.startup_statuses[-1] == 200
    assert 503 in limited.startup_statuses  # it answered while the model was loading
    assert httpx.get(limited.url + "/ready").json()["cache"] == "off"


def test_logs_are_json_with_one_access_line_a_request(limited: Server):
    """--log-format json: every line the server and its engine process write is one
    object stamped in UTC (RFC 3339, milliseconds), and each request gets one access line
    (never its key)."""
    headers = {"Authorization": "Bearer sk-logs", "x-request-id": "log-test-1"}
    assert httpx.get(limited.url + "/v1/models", headers=headers).status_code == 200
    # The line is written once the response has been sent, just after the client has it.
    until("the access line is written", lambda: "log-test-1" in limited.log_path.read_text())
    lines = [json.loads(line) for line in limited.log_path.read_text().splitlines() if line]
    (access,) = [line for line in lines if line.get("request_id") == "log-test-1"]
    assert access["logger"] == "semgate.access" and access["level"] == "info"
    assert (access["method"], access["path"], access["status"]) == ("GET", "/v1/models", 200)
    assert access["tenant"] == "t5" and access["duration_ms"] >= 0
    assert any(line["logger"] == "semgate.engine" for line in lines)  # the engine core's too
    assert "sk-logs" not in limited.log_path.read_text()
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]), line
    stamped = datetime.fromisoformat(access["time"])
    assert abs((datetime.now(UTC) - stamped).total_seconds()) < 60  # UTC, not local time


def test_rate_limit_is_per_api_key(limited: Server):
    statuses = [post(limited, "sk-limited").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    refused = post(limited, "sk-limited")
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert post(limited, "sk-other").status_code == 200  # another key has its own budget


def test_full_engine_queue_answers_429_at_once(limited: Server):
    """One slot, no waiting room: a second request while one runs is refused, not queued."""
    headers = {"Authorization": "Bearer sk-queue"}
    body = chat_body("Count to ten.", max_tokens=1000, stream=True, ignore_eos=True)
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", limited.url + "/v1/chat/completions", json=body, headers=headers
        ) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()  # keep it: a collected iterator closes the connection
        next(lines)  # the first request now holds the engine's only slot
        busy: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: busy.append(post(limited, "sk-queue")))
        worker.start()
        worker.join(60)
    assert busy[0].status_code == 429
    assert busy[0].headers["retry-after"] == "1"
    assert busy[0].json()["error"]["code"] == "engine_overloaded"


def test_unknown_keys_get_401_and_lock_no_one_out(limited: Server):
    """Made-up keys get 401 (clients do not retry it) within their address's own failed-auth
    budget (60 a minute, not the keys' 3), and a 429 past it; a tenant and the operator
    at the same address keep their budgets, and the admin key has a budget of its own
    (5/minute here)."""
    keyless = httpx.post(limited.url + "/v1/chat/completions", json=chat_body("Hi."), timeout=60)
    budget = failed_auth_budget()
    guesses = [keyless] + [post(limited, f"sk-made-up-{i}") for i in range(budget)]
    assert [r.status_code for r in guesses] == [401] * budget + [429]
    assert guesses[0].json()["error"]["code"] == "missing_api_key"
    assert guesses[1].json()["error"]["code"] == "invalid_api_key"
    assert post(limited, "sk-fresh").status_code == 200
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    statuses = [
        httpx.get(limited.url + "/admin/cache/stats", headers=admin).status_code for _ in range(6)
    ]
    assert statuses == [400] * 5 + [429]  # 400: the cache is off on this server
    assert post(limited, "sk-fresh").status_code == 200  # the admin's 429 is its own


def test_wrong_admin_keys_are_limited_on_an_open_gateway_without_rate_limits(
    fake: FakeUpstream,
):
    """No --rate-limit, no API keys: admin keys guessed from one address still get their
    401s only within the failed-auth budget, then 429s, while the admin key and chat at
    that address keep working. (A gateway of its own: the budget is per address.)"""
    server = Server(["--upstream", fake.url, "--no-cache", "--admin-key", ADMIN_KEY])
    budget = failed_auth_budget()
    with serving(server), httpx.Client(base_url=server.url, timeout=60) as client:
        guesses = [
            client.get("/admin/cache/stats", headers={"Authorization": f"Bearer sk-guess-{i}"})
            for i in range(budget + 1)
        ]
        assert [r.status_code for r in guesses] == [401] * budget + [429]
        assert guesses[-1].json()["error"]["code"] == "rate_limit_exceeded"
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert client.get("/admin/cache/stats", headers=admin).status_code == 400  # cache off
        chat = client.post("/v1/chat/completions", json=chat_body("Hi.", model=FAKE_MODEL))
        assert chat.status_code == 200

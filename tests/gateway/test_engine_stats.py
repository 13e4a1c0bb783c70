"""GET /admin/engine/stats: the in-process engine's load and its last minute's steps."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.gateway.conftest import chat_body
from tests.gateway.servers import MODEL


def test_engine_stats_split_the_last_minute_into_prefill_and_decode(
    admin: httpx.Client, http: httpx.Client
):
    question = f"In one word, what colour is the sky? (ticket {uuid.uuid4()})"
    body = chat_body(question, max_tokens=8, ignore_eos=True)
    answer = http.post("/v1/chat/completions", json=body, headers={"Cache-Control": "no-store"})
    assert answer.status_code == 200, answer.text

    stats = admin.get("/admin/engine/stats")
    assert stats.status_code == 200, stats.text
    s = stats.json()
    assert s["model"] == MODEL and s["running"] == 0 and s["waiting"] == 0
    # The backend "auto" chose on this CPU, and no CUDA graphs here.
    assert s["attention_backend"] in ("cpu", "torch") and s["decode_steps"] == "eager"
    assert 0 <= s["kv_cache_usage"] < 1
    minute = s["last_minute"]
    prefill, decode = minute["prefill"], minute["decode"]
    # Its prompt past any cached prefix was prefilled, and its 7 later tokens decoded
    # (with whatever else the session's gateway ran in the last minute).
    assert prefill["steps"] >= 1 and prefill["tokens"] > 0
    assert decode["steps"] >= 7 and decode["tokens"] >= 7
    assert prefill["share"] + decode["share"] == pytest.approx(1, abs=1e-3)
    assert prefill["mean_step_ms"] > 0 and decode["mean_step_ms"] > 0
    assert 0 < minute["busy_fraction"] <= 1 and 0 < minute["window_seconds"] <= 60


def test_engine_stats_need_the_admin_key(http: httpx.Client):
    assert http.get("/admin/engine/stats").status_code == 403

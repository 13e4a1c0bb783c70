"""What the cache saved, by the session's gateway: each hit counts its entry's stored
tokens and generation time under its tenant and model, in the admin API's stats and in
/metrics, and tells its client the time in X-Cache-Saved-Seconds."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import chat_body, client_of, seed, settle
from tests.gateway.fixtures import BOB
from tests.gateway.servers import MODEL, Server, metric

pytestmark = pytest.mark.usefixtures("fresh")


def tokens_of(tenant: str) -> str:
    return f'semgate_cache_saved_tokens_total{{tenant="{tenant}",model_name="{MODEL}"}}'


def seconds_of(tenant: str) -> str:
    return f'semgate_cache_saved_seconds_total{{tenant="{tenant}",model_name="{MODEL}"}}'


NOTHING = {"hits": 0, "completion_tokens": 0, "prompt_tokens": 0, "seconds": 0.0,
           "hits_without_tokens": 0, "hits_without_seconds": 0}  # fmt: skip


def saved(admin: httpx.Client) -> dict[str, dict[str, Any]]:
    """alice's and bob's savings on the model, from the admin API's stats."""
    stats = admin.get("/admin/cache/stats").json()["saved"]
    return {
        tenant: {**NOTHING, **stats.get(tenant, {}).get(MODEL, {})} for tenant in ("alice", "bob")
    }


def moved(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {name: after[name] - before[name] for name in NOTHING}


def ask(client: httpx.Client, question: str) -> httpx.Response:
    response = client.post("/v1/chat/completions", json=chat_body(question))
    assert response.status_code == 200, response.text
    return response


def test_hits_count_the_stored_tokens_and_generation_time_of_their_entry(
    gateway: Server, admin: httpx.Client, http: httpx.Client
):
    before = saved(admin)
    tokens_before = metric(gateway, tokens_of("alice"), 0)
    seconds_before = metric(gateway, seconds_of("alice"), 0)
    bob_before = metric(gateway, tokens_of("bob"), 0)
    question = "How many legs does a spider have?"
    t0 = time.perf_counter()
    miss = ask(http, question)
    elapsed = time.perf_counter() - t0
    assert miss.headers["x-cache-status"] == "Miss"
    assert "x-cache-saved-seconds" not in miss.headers
    settle(gateway.url)
    assert saved(admin) == before  # a miss saves nothing

    [entry] = admin.get("/admin/cache/entries", params={"tenant": "alice"}).json()["data"]
    stored = entry["metadata"]
    assert stored["completion_tokens"] == miss.json()["usage"]["completion_tokens"] > 0
    assert 0 < stored["generation_seconds"] < elapsed  # the engine's part of the request

    for asked, tier in ((question, "exact"), ("How many legs do spiders have?", "semantic")):
        hit = ask(http, asked)
        assert hit.headers["x-cache-status"] == "Hit", tier
        assert hit.headers["x-cache-entry"] == entry["id"]
        assert float(hit.headers["x-cache-saved-seconds"]) == stored["generation_seconds"]
        assert hit.json()["usage"]["completion_tokens"] == stored["completion_tokens"]

    after = saved(admin)
    assert moved(after["alice"], before["alice"]) == pytest.approx({
        "hits": 2,
        "completion_tokens": 2 * stored["completion_tokens"],
        "prompt_tokens": 2 * stored["prompt_tokens"],
        "seconds": 2 * stored["generation_seconds"],
        "hits_without_tokens": 0,
        "hits_without_seconds": 0,
    })  # fmt: skip
    assert after["bob"] == before["bob"]  # bob's partition saved nothing of alice's hits
    assert metric(gateway, tokens_of("bob"), 0) == bob_before
    assert metric(gateway, tokens_of("alice")) - tokens_before == 2 * stored["completion_tokens"]
    assert metric(gateway, seconds_of("alice")) - seconds_before == pytest.approx(
        2 * stored["generation_seconds"]
    )


def test_a_seeded_entry_saves_its_tokens_but_no_known_time(gateway: Server, admin: httpx.Client):
    before = saved(admin)
    tokens_before = metric(gateway, tokens_of("bob"), 0)
    seconds_before = metric(gateway, seconds_of("bob"), 0)
    question = "What is the boiling point of water at sea level?"
    usage = seed(admin, question, "100 degrees Celsius.", "bob")["metadata"]
    assert "generation_seconds" not in usage  # nobody generated it: no time is made up

    with client_of(gateway, BOB) as bob:
        hit = ask(bob, question)
    assert hit.headers["x-cache-status"] == "Hit"
    assert "x-cache-saved-seconds" not in hit.headers

    after = saved(admin)
    assert moved(after["bob"], before["bob"]) == {
        "hits": 1,
        "completion_tokens": usage["completion_tokens"],
        "prompt_tokens": usage["prompt_tokens"],
        "seconds": 0.0,
        "hits_without_tokens": 0,
        "hits_without_seconds": 1,
    }
    assert after["alice"] == before["alice"]
    assert metric(gateway, tokens_of("bob")) - tokens_before == usage["completion_tokens"]
    assert metric(gateway, seconds_of("bob"), 0) == seconds_before

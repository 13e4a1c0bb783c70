"""What the store refuses (TTLs past the maximum, with nothing half-written) and how it
holds up under a burst (a bounded, blocking connection pool), against the real Redis."""

from __future__ import annotations

import asyncio

import pytest

from cache import CompletionOutcome, EmbeddedRedis, Embedder, SemanticCache
from cache.store import MAX_TTL, CacheStore
from tests.cache.fixtures import Run, ask

DONE = CompletionOutcome("Paris is the capital of France.", "stop")


@pytest.mark.parametrize("ttl", [10**20, MAX_TTL + 1, 0])
def test_a_store_with_a_ttl_out_of_range_writes_nothing(
    cache: SemanticCache, store: CacheStore, tenant: str, run: Run, ttl: int
):
    """EXPIRE of an overflowing TTL fails inside the transaction, after the HSET: the
    entry was left without an expiry. Now it is refused before anything is written."""
    scope = cache.policy.scope(ask("", tenant))
    question = "What is the capital of France?"
    vector = run(cache.embedder.embed(question))
    with pytest.raises(ValueError, match="ttl"):
        run(store.put(scope, question, DONE.text, vector, ttl=ttl))
    assert run(store.get(store.entry_id(scope, question))) is None

    assert run(cache.store_answer(ask(question, tenant), DONE, ttl=ttl)) is None
    assert cache.stats.stores == 0 and sum(cache.stats.errors.values()) == 1
    with pytest.raises(ValueError, match="ttl"):
        run(cache.seed(question, DONE.text, model="m", tenant=tenant, ttl=ttl))
    assert run(store.list(tenant=tenant))[0] == 0
    assert run(cache.lookup(ask(question, tenant))).status == "miss"


def test_the_longest_ttl_is_kept(cache: SemanticCache, store: CacheStore, tenant: str, run: Run):
    entry = run(cache.seed("How old is the universe?", "13.8 billion years.", model="m",
                           tenant=tenant, ttl=MAX_TTL))  # fmt: skip
    stored = run(store.get(entry.id))
    assert stored is not None and stored.ttl is not None and MAX_TTL - 60 < stored.ttl <= MAX_TTL


@pytest.mark.parametrize("max_connections", [None, 4], ids=["default", "four"])
def test_a_burst_of_300_lookups_gets_no_redis_errors(
    redis_server: EmbeddedRedis,
    embedder: Embedder,
    tenant: str,
    run: Run,
    max_connections: int | None,
):
    """redis-py's default async pool raised MaxConnectionsError at once past 100
    connections in use, so a burst's lookups failed open. A blocking pool makes them wait
    for a connection instead (the lookup's budget bounds the wait; it is generous here
    so that a busy test host cannot turn waits into timeouts)."""
    pool = {} if max_connections is None else {"max_connections": max_connections}
    store = CacheStore(
        redis_server.url, embedder.model_id, embedder.dims, index_name="semgate-test", **pool
    )
    cache = SemanticCache(store, embedder, timeout=30)
    questions = [f"What is the population of city number {i}?" for i in range(10)]
    try:
        run(store.connect())
        for q in questions:
            assert run(cache.store_answer(ask(q, tenant), DONE)) is not None

        async def burst() -> list[str]:
            results = await asyncio.gather(
                *(cache.lookup(ask(questions[i % 10], tenant)) for i in range(300))
            )
            return [r.status for r in results]

        statuses = run(burst(), timeout=120)
        assert not cache.stats.errors, cache.stats.errors
        assert statuses == ["hit"] * 300 and cache.stats.hits == 300
    finally:
        run(store.close())

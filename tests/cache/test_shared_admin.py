"""The admin's thresholds and the stats, shared through Redis by every process: two
SemanticCache facades over one real Redis stand in for two gateway replicas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cache import CacheStore, Embedder, SemanticCache, Thresholds
from cache.shared_admin import SETTINGS_KEY, SharedAdmin, add_up
from tests.cache.fixtures import Run
from tests.waiting import until


@pytest.fixture
def replicas(store: CacheStore, embedder: Embedder, run: Run) -> Iterator[list[SharedAdmin]]:
    run(store.client.delete(SETTINGS_KEY))
    admins = [SharedAdmin(store.client, SemanticCache(store, embedder)) for _ in range(2)]
    for admin in admins:
        run(admin.start())
    yield admins
    for admin in admins:
        run(admin.stop())
    run(store.client.delete(SETTINGS_KEY))


def test_a_threshold_change_reaches_every_replica_and_outlives_them(
    replicas: list[SharedAdmin], store: CacheStore, embedder: Embedder, run: Run
):
    first, second = replicas
    new = Thresholds(0.91, {"m": 0.8}, {"strict": 0.99})
    run(first.set_thresholds(new))
    assert first.cache.thresholds == new
    until("the other replica applies it", lambda: second.cache.thresholds == new)
    # A process started later (a restart) begins with the stored value, not its own.
    late = SharedAdmin(store.client, SemanticCache(store, embedder, thresholds=Thresholds(0.5)))
    run(late.start())
    try:
        assert late.cache.thresholds == new
    finally:
        run(late.stop())


def test_stats_add_up_every_replica_and_count_them(replicas: list[SharedAdmin], run: Run):
    first, second = replicas
    first.cache.stats.lookups = 3
    first.cache.stats.hits_by_tier["exact"] = 1
    second.cache.stats.lookups, second.cache.stats.misses = 5, 5
    second.cache.stats.errors["timeout"] += 2
    run(second._publish())
    total = run(first.stats())
    assert total["replicas"] >= 2  # both (and any other test's process still publishing)
    assert total["lookups"] >= 8 and total["hits"] >= 1 and total["misses"] >= 5
    assert total["hits_by_tier"]["exact"] >= 1
    assert total["tiers"]["semantic-english"]["languages"] == ["en"]
    assert total["errors"]["timeout"] >= 2
    assert total["best_similarity_histogram"]["buckets"] == list(
        first.cache.stats.snapshot()["best_similarity_histogram"]["buckets"]
    )


def test_add_up_adds_counters_and_keeps_what_is_the_same_everywhere():
    bounds = [0.5, 1.0]
    one = {"n": 1, "by": {"a": 1}, "h": {"buckets": bounds, "counts": [1, 2], "sum": 0.5}}
    two = {"n": 2, "by": {"a": 1, "b": 4}, "h": {"buckets": bounds, "counts": [3, 4], "sum": 1.0}}
    assert add_up(add_up({}, one), two) == {
        "n": 3,
        "by": {"a": 2, "b": 4},
        "h": {"buckets": [0.5, 1.0], "counts": [4, 6], "sum": 1.5},
    }


def test_what_hits_saved_adds_up_per_tenant_and_model_whatever_they_are_named():
    """Tenant and model names are keys of nested dicts: one named like a field that is kept
    from one replica (the histogram's "buckets") is added up all the same."""
    one = {"saved": {"buckets": {"m": {"hits": 1, "seconds": 0.5}}, "a": {"m": {"hits": 2}}}}
    two = {"saved": {"buckets": {"m": {"hits": 3, "seconds": 1.0}}, "b": {"n": {"hits": 1}}}}
    assert add_up(add_up({}, one), two) == {
        "saved": {
            "buckets": {"m": {"hits": 4, "seconds": 1.5}},
            "a": {"m": {"hits": 2}},
            "b": {"n": {"hits": 1}},
        }
    }

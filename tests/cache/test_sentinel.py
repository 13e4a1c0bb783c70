"""The cache's store on a Sentinel-managed Redis Stack (tests/redis_sentinel.py): its
start-up check, and its index on the replica (Redis replicates FT.CREATE), so that a
promoted replica answers semantic lookups at once. The failover itself, through a real
gateway: tests/gateway/test_sentinel_failover.py."""

from __future__ import annotations

from urllib.parse import quote

import numpy as np
import pytest

from cache.policy import CacheScope
from cache.redis_server import RedisUnavailableError, check_redis_url
from cache.store import CacheStore
from tests.cache.fixtures import Run
from tests.redis_sentinel import PASSWORD, SentinelCluster

DIMS = 8


def test_the_index_and_the_entries_are_on_the_replica_too(sentinel: SentinelCluster, run: Run):
    store = CacheStore(sentinel.url(), "test-embedder", DIMS, index_name="semgate-sentinel")
    scope = CacheScope("sentinel-tenant", "m", "")
    vector = np.linspace(1, 2, DIMS, dtype=np.float32)
    try:
        run(store.connect())
        entry = run(store.put(scope, "Is the index replicated?", "Yes.", vector, ttl=600))
        found = run(store.search(scope, vector, k=1))
    finally:
        run(store.close())
    assert [c.entry.id for c in found] == [entry.id]
    sentinel.replicated()
    with sentinel.replica().client() as replica:
        assert "semgate-sentinel" in {name.decode() for name in replica.execute_command("FT._LIST")}
        info = replica.ft("semgate-sentinel").info()
        assert int(info["num_docs"]) >= 1
        assert replica.hget(store.key(entry.id), "response") == b"Yes."


def test_the_start_up_check_follows_the_sentinels_to_the_primary(sentinel: SentinelCluster):
    check_redis_url(sentinel.url())  # the primary they name has the search module
    with pytest.raises(RedisUnavailableError, match="No master found for 'elsewhere'"):
        check_redis_url(sentinel.url().replace("/semgate/0", "/elsewhere/0"))
    wrong = sentinel.url().replace(quote(PASSWORD, safe=""), "wrong")
    with pytest.raises(RedisUnavailableError, match=r"cannot reach Redis: .*password"):
        check_redis_url(wrong)

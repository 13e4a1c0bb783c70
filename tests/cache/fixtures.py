"""One embedded Redis Stack and one of each embedder per test session; an event loop in a
thread so async cache calls can run from plain tests; a Redis Sentinel cluster (primary,
replica, three sentinels: tests/redis_sentinel.py) started the first time a test asks
for it. A plugin of the root conftest: tests/cache, tests/bench (calibration),
tests/resilience and tests/gateway share one of each."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cache import CacheRequest, EmbeddedRedis, Embedder, MultilingualEmbedder, SemanticCache
from cache.store import CacheStore
from cache.tiers import multilingual_field
from tests.redis_sentinel import SentinelCluster

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(scope="session")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture(scope="session")
def run(loop: asyncio.AbstractEventLoop) -> Run:
    def run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    return run


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sentinel_cluster() -> Iterator[SentinelCluster]:
    cluster = SentinelCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def sentinel(sentinel_cluster: SentinelCluster) -> SentinelCluster:
    """The session's Sentinel cluster with a primary and a replica in sync: a node that an
    earlier test killed is back, as a replica."""
    sentinel_cluster.mend()
    return sentinel_cluster


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    emb = Embedder()
    yield emb
    emb.close()


def connected(store: CacheStore, run: Run) -> Iterator[CacheStore]:
    """`store`, connected for as long as its fixture lasts."""
    run(store.connect())
    yield store
    run(store.close())


@pytest.fixture(scope="session")
def store(redis_server: EmbeddedRedis, embedder: Embedder, run: Run) -> Iterator[CacheStore]:
    st = CacheStore(redis_server.url, embedder.model_id, embedder.dims, index_name="semgate-test")
    yield from connected(st, run)


@pytest.fixture
def cache(store: CacheStore, embedder: Embedder) -> SemanticCache:
    """A fresh facade (own stats) over the shared store: English and exact tiers."""
    return SemanticCache(store, embedder)


@pytest.fixture(scope="session")
def multilingual() -> Iterator[MultilingualEmbedder]:
    emb = MultilingualEmbedder()
    yield emb
    emb.close()


@pytest.fixture(scope="session")
def every_tier_store(
    redis_server: EmbeddedRedis, embedder: Embedder, multilingual: MultilingualEmbedder, run: Run
) -> Iterator[CacheStore]:
    """A store with the multilingual tier's vectors too (its own index: an index is
    defined again whenever a store with other fields connects to it)."""
    st = CacheStore(
        redis_server.url,
        embedder.model_id,
        embedder.dims,
        index_name="semgate-test-tiers",
        extra_vectors=(multilingual_field(multilingual),),
    )
    yield from connected(st, run)


@pytest.fixture
def every_tier_cache(
    every_tier_store: CacheStore, embedder: Embedder, multilingual: MultilingualEmbedder
) -> SemanticCache:
    """A fresh facade with every tier: exact, English and multilingual."""
    return SemanticCache(every_tier_store, embedder, multilingual=multilingual)


@pytest.fixture
def tenant() -> str:
    """A tenant no other test uses, so tests never see each other's entries."""
    return f"t-{uuid.uuid4().hex[:10]}"


def ask(question: str, tenant: str, model: str = "m", **kw: Any) -> CacheRequest:
    """A one-turn greedy request (override any CacheRequest field through kw)."""
    kw.setdefault("temperature", 0.0)
    before = kw.pop("before", [])
    return CacheRequest(
        model=model, tenant=tenant, messages=[*before, {"role": "user", "content": question}], **kw
    )

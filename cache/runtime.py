"""The cache's resources at run time: Redis (embedded unless a URL is given), the
embedders, the cross-encoder and the store, opened and closed as one."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cache.embedder import Embedder
from cache.guard import cross_encoder
from cache.multilingual_embedder import MultilingualEmbedder
from cache.redis_server import EmbeddedRedis, check_redis_url
from cache.semantic_cache import SemanticCache
from cache.store import DEFAULT_MAX_CONNECTIONS, CacheStore
from cache.supervisor import RedisSupervisor
from cache.tiers import multilingual_field


class ModelNotLoaded(RuntimeError):
    """An embedder or the cross-encoder failed to load: its files are missing or broken,
    which no retry mends."""


class CacheRuntime:
    """Owns what the cache needs at run time: Redis (embedded unless a URL is given,
    and watched either way by `supervisor`), the embedder (unless the caller lends its
    own, or how to get it, and then closes it itself) and the store. `async with
    CacheRuntime(...) as cache:`. Once Redis is up, the embedders and the cross-encoder
    load side by side; `load_times` says how long each piece took."""

    def __init__(
        self,
        redis_url: str | None = None,
        data_dir: Path | None = None,
        maxmemory: str = "512mb",
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        embedder: Embedder | Callable[[], Awaitable[Embedder]] | None = None,
        multilingual: MultilingualEmbedder | None = None,
        **cache_options: Any,
    ) -> None:
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.maxmemory = maxmemory
        self.max_connections = max_connections
        self.cache_options = cache_options
        self._lent = embedder
        self.embedder: Embedder | None = None
        self._owns_embedder = embedder is None
        self.multilingual = multilingual
        self._owns_multilingual = multilingual is None
        self.server: EmbeddedRedis | None = None
        self.store: CacheStore | None = None
        self.supervisor: RedisSupervisor | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.load_times: dict[str, float] = {}  # seconds, by piece

    async def __aenter__(self) -> SemanticCache:
        try:
            started = time.perf_counter()
            url = self.redis_url
            if url:
                await asyncio.to_thread(check_redis_url, url)
            else:
                if self.data_dir is None:
                    self._tmp = tempfile.TemporaryDirectory(prefix="semgate-redis-")
                    self.data_dir = Path(self._tmp.name)
                self.server = EmbeddedRedis(self.data_dir, maxmemory=self.maxmemory)
                url = await asyncio.to_thread(self.server.start)
            self.load_times["Redis"] = time.perf_counter() - started
            # After Redis, which may be down for a while: each attempt the caller makes
            # loads nothing until then.
            await self._load_models()
            emb, multilingual = self.embedder, self.multilingual
            assert emb is not None and multilingual is not None  # else _load_models raised
            self.store = CacheStore(
                url,
                emb.model_id,
                emb.dims,
                max_connections=self.max_connections,
                extra_vectors=(multilingual_field(multilingual),),
            )
            await self.store.connect()
            self.supervisor = RedisSupervisor(self.store.client, self.server)
            self.supervisor.start()
        except BaseException:
            await self.__aexit__()
            raise
        return SemanticCache(
            self.store,
            emb,
            redis=self.supervisor,
            multilingual=multilingual,
            **self.cache_options,
        )

    async def _load_models(self) -> None:
        """The embedders and the cross-encoder (loaded now rather than by the first
        question the verifier decides), side by side on threads. Each is awaited even
        after another failed: what loaded is then closed by __aexit__."""

        async def embedder() -> None:
            lent = self._lent
            if lent is None:
                self.embedder = await asyncio.to_thread(Embedder)
            else:
                self.embedder = lent if isinstance(lent, Embedder) else await lent()

        async def multilingual() -> None:
            if self.multilingual is None:
                self.multilingual = await asyncio.to_thread(MultilingualEmbedder)

        async def timed(name: str, load: Awaitable[object]) -> float:
            started = time.perf_counter()
            try:
                await load
            except Exception as exc:
                raise ModelNotLoaded(f"the {name} did not load: {exc}") from exc
            return time.perf_counter() - started

        loads = {
            "embedder": embedder(),
            "multilingual embedder": multilingual(),
            "cross-encoder": asyncio.to_thread(cross_encoder.shared),
        }
        each = [timed(name, load) for name, load in loads.items()]
        times = await asyncio.gather(*each, return_exceptions=True)
        for name, took in zip(loads, times, strict=True):
            if isinstance(took, BaseException):
                raise took
            self.load_times[name] = took

    async def __aexit__(self, *exc: object) -> None:
        if self.supervisor is not None:  # first: a server stopped here is not restarted
            await self.supervisor.stop()
        if self.store is not None:
            await self.store.close()
        if self.embedder is not None and self._owns_embedder:
            self.embedder.close()
        if self.multilingual is not None and self._owns_multilingual:
            self.multilingual.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
        if self._tmp is not None:
            self._tmp.cleanup()

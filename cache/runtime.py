"""The cache's resources at run time: Redis (embedded unless a URL is given), the
embedders, the cross-encoder and the store, opened and closed as one."""

from __future__ import annotations

import asyncio
import tempfile
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


class CacheRuntime:
    """Owns what the cache needs at run time: Redis (embedded unless a URL is given,
    and watched either way by `supervisor`), the embedder (unless the caller lends its
    own, which it then closes itself) and the store. `async with CacheRuntime(...) as
    cache:`."""

    def __init__(
        self,
        redis_url: str | None = None,
        data_dir: Path | None = None,
        maxmemory: str = "512mb",
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        embedder: Embedder | None = None,
        multilingual: MultilingualEmbedder | None = None,
        **cache_options: Any,
    ) -> None:
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.maxmemory = maxmemory
        self.max_connections = max_connections
        self.cache_options = cache_options
        self.embedder = embedder
        self._owns_embedder = embedder is None
        self.multilingual = multilingual
        self._owns_multilingual = multilingual is None
        self.server: EmbeddedRedis | None = None
        self.store: CacheStore | None = None
        self.supervisor: RedisSupervisor | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def __aenter__(self) -> SemanticCache:
        try:
            url = self.redis_url
            if url:
                await asyncio.to_thread(check_redis_url, url)
            else:
                if self.data_dir is None:
                    self._tmp = tempfile.TemporaryDirectory(prefix="semgate-redis-")
                    self.data_dir = Path(self._tmp.name)
                self.server = EmbeddedRedis(self.data_dir, maxmemory=self.maxmemory)
                url = await asyncio.to_thread(self.server.start)
            if self.embedder is None:
                self.embedder = await asyncio.to_thread(Embedder)
            if self.multilingual is None:
                self.multilingual = await asyncio.to_thread(MultilingualEmbedder)
            # Loaded now rather than by the first question the verifier decides.
            await asyncio.to_thread(cross_encoder.shared)
            emb = self.embedder
            self.store = CacheStore(
                url,
                emb.model_id,
                emb.dims,
                max_connections=self.max_connections,
                extra_vectors=(multilingual_field(self.multilingual),),
            )
            await self.store.connect()
            self.supervisor = RedisSupervisor(self.store.client, self.server)
            self.supervisor.start()
        except BaseException:
            await self.__aexit__()
            raise
        return SemanticCache(
            self.store,
            self.embedder,
            redis=self.supervisor,
            multilingual=self.multilingual,
            **self.cache_options,
        )

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

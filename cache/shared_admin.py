"""What the admin API sets and reads, shared by every gateway process on one Redis.

- The thresholds the admin API sets live in Redis (one hash: the JSON value and a
  version counter). Every process polls the version twice a second and applies a new
  value: a change reaches all replicas within a second, and survives their restarts
  (the value stored by the admin API wins over the configured one at start).
- Each process publishes its counters (CacheStats' snapshot, what hits saved per tenant
  and model included, plus what the caller adds) every half second, under its own key
  that expires when it stops publishing; the admin API's stats add up every live
  process's and say how many reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis.asyncio as aioredis

from cache.semantic_cache import SemanticCache
from cache.thresholds import Thresholds

log = logging.getLogger(__name__)

SETTINGS_KEY = "semgate:admin:thresholds"
STATS_PREFIX = "semgate:admin:stats:"
SYNC_SECONDS = 0.5
STATS_TTL_SECONDS = 5  # a process that stopped publishing drops out of the sum
STOP_SECONDS = 2.0  # at shutdown, for the sync loop to end
# Lists every process reports alike (the histogram's bounds, the languages a tier
# serves): kept from one, not added up. Lists only: a dict under such a name (a tenant
# named "buckets") is added up.
_SAME_EVERYWHERE = frozenset({"buckets", "languages"})


def add_up(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Counters added field by field (numbers, nested dicts, lists element-wise)."""
    out = dict(total)
    for key, value in more.items():
        mine = out.get(key)
        if mine is None or (key in _SAME_EVERYWHERE and isinstance(value, list)):
            out.setdefault(key, value)
        elif isinstance(value, dict) and isinstance(mine, dict):
            out[key] = add_up(mine, value)
        elif isinstance(value, list) and isinstance(mine, list) and len(value) == len(mine):
            out[key] = [a + b for a, b in zip(mine, value, strict=True)]
        elif isinstance(value, int | float) and isinstance(mine, int | float):
            out[key] = mine + value
    return out


class SharedAdmin:
    def __init__(
        self,
        client: aioredis.Redis,
        cache: SemanticCache,
        local_counts: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.client = client
        self.cache = cache
        self.local_counts = local_counts  # the caller's own per-process counters
        self.replica = uuid.uuid4().hex[:12]
        self._version: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        with contextlib.suppress(Exception):  # Redis down: the configured values meanwhile
            await self._pull()
        self._task = asyncio.get_running_loop().create_task(self._sync())

    async def stop(self) -> None:
        # A shutdown once waited for ever on this task, its cancel lost (while the
        # engine core restarted; the likeliest thief is a Redis command's timeout,
        # caught below as a failed sync): the loop also ends on its own, and the wait
        # is bounded.
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=STOP_SECONDS)
        with contextlib.suppress(Exception):
            await self.client.delete(STATS_PREFIX + self.replica)

    async def set_thresholds(self, thresholds: Thresholds) -> None:
        """Stores the admin's new thresholds for every process (raises if Redis fails:
        then nothing changed anywhere)."""
        value = json.dumps(
            {
                "default": thresholds.default,
                "per_model": thresholds.per_model,
                "per_tenant": thresholds.per_tenant,
            }
        )
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(SETTINGS_KEY, "value", value)
            pipe.hincrby(SETTINGS_KEY, "version", 1)
            _, version = await pipe.execute()
        self._version = int(version)
        self.cache.thresholds = thresholds  # one assignment: the old or the new, never a mix

    async def stats(self) -> dict[str, Any]:
        """Every live process's counters added up, with `replicas`: how many reported."""
        await self._publish()  # this process's own, fresh
        keys = [key async for key in self.client.scan_iter(match=STATS_PREFIX + "*")]
        total: dict[str, Any] = {}
        reported = 0
        for raw in await self.client.mget(keys) if keys else []:
            if raw is not None:
                total = add_up(total, json.loads(raw))
                reported += 1
        lookups, hits = total.get("lookups", 0), total.get("hits", 0)
        return total | {"hit_rate": hits / lookups if lookups else 0.0, "replicas": reported}

    def _snapshot(self) -> dict[str, Any]:
        in_flight = self.cache.coalescer.in_flight()
        return {**self.cache.snapshot(), "in_flight": in_flight, **self.local_counts()}

    async def _publish(self) -> None:
        value = json.dumps(self._snapshot())
        await self.client.set(STATS_PREFIX + self.replica, value, ex=STATS_TTL_SECONDS)

    async def _pull(self) -> None:
        fields = await self.client.hmget(SETTINGS_KEY, ["version", "value"])
        version, value = cast(list[bytes | None], fields)  # bytes: no decode_responses
        if version is None or value is None or int(version) == self._version:
            return
        self.cache.thresholds = Thresholds(**json.loads(value))
        if self._version is not None:
            log.info("thresholds changed by another process: %s", value.decode())
        self._version = int(version)

    async def _sync(self) -> None:
        while not self._stopping:
            await asyncio.sleep(SYNC_SECONDS)
            if self.cache.down_reason is not None:
                continue  # the supervisor reports the outage; nothing to share meanwhile
            try:
                await self._pull()
                await self._publish()
            except Exception as exc:  # a moment before the supervisor notices
                log.debug("admin state not synced: %r", exc)

"""The cache as the gateway sees it: policy, exact tier, semantic tier, guard, stats,
single-flight and fail-open, over the store and the embedder.

Fail open: any Redis or embedder failure, or a lookup slower than `timeout`, is a
miss (status "error", counted by kind); a failed store is logged and counted.
The request is always answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import redis.exceptions

from cache.embedder import Embedder
from cache.guard import Guard, Verdict
from cache.policy import CachePolicy, CacheRequest, CacheScope, CompletionOutcome
from cache.redis_server import EmbeddedRedis, check_redis_url
from cache.shared_flight import Claim, Codec, FlightLost, SharedFlights, aclose
from cache.singleflight import SingleFlight
from cache.stats import CacheStats
from cache.store import CacheEntry, CacheStore, Candidate
from cache.thresholds import Thresholds

log = logging.getLogger(__name__)

Status = Literal["hit", "miss", "bypass", "error"]


@dataclass(frozen=True)
class CheckedCandidate:
    candidate: Candidate
    verdict: Verdict
    above_threshold: bool


@dataclass
class LookupResult:
    status: Status
    threshold: float
    scope: CacheScope | None = None
    question: str | None = None
    hit: Candidate | None = None
    reason: str | None = None  # bypass or error reason
    candidates: list[CheckedCandidate] = field(default_factory=list)
    vector: np.ndarray | None = None

    @property
    def best(self) -> CheckedCandidate | None:
        return self.candidates[0] if self.candidates else None


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, redis.exceptions.RedisError | ConnectionError | OSError):
        return "redis"
    return "internal"


class SemanticCache:
    def __init__(
        self,
        store: CacheStore,
        embedder: Embedder,
        thresholds: Thresholds | None = None,
        policy: CachePolicy | None = None,
        guard: Guard | None = None,
        default_ttl: int | None = 7 * 24 * 3600,
        timeout: float = 1.0,
        candidates: int = 3,
        shared_flights: SharedFlights | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.thresholds = thresholds or Thresholds()
        self.policy = policy or CachePolicy()
        self.guard = guard if guard is not None else Guard()
        self.default_ttl = default_ttl
        self.timeout = timeout
        self.candidates = candidates
        self.stats = CacheStats()
        self.singleflight: SingleFlight[Any] = SingleFlight(self.guard)
        self.shared_flights = shared_flights or SharedFlights(store.client, timeout=timeout)
        self._background: set[asyncio.Task[None]] = set()  # hit counters in flight

    def threshold_for(self, scope: CacheScope) -> float:
        return self.thresholds.for_scope(scope.tenant, scope.model)

    async def lookup(
        self,
        request: CacheRequest,
        dry_run: bool = False,
        threshold: float | None = None,
        candidates: int | None = None,
    ) -> LookupResult:
        """Exact tier, then semantic tier + guard over the `candidates` nearest entries. A
        dry run changes no counters and no hit counts, and reports every candidate with its
        similarity and verdict."""
        decision = self.policy.may_lookup(request)
        if not decision.allowed:
            if not dry_run:
                self.stats.bypasses += 1
            return LookupResult("bypass", threshold or 0.0, reason=decision.reason)
        question = self.policy.question(request)
        assert question is not None
        scope = self.policy.scope(request)
        threshold = self.threshold_for(scope) if threshold is None else threshold
        if not dry_run:
            self.stats.lookups += 1
        try:
            result = await asyncio.wait_for(
                self._lookup(scope, question, threshold, candidates or self.candidates),
                self.timeout,
            )
        except Exception as exc:
            kind = _error_kind(exc)
            if not dry_run:
                self.stats.errors[kind] += 1
            log.warning("cache lookup failed open (%s): %r", kind, exc)
            return LookupResult("error", threshold, scope, question, reason=f"{kind}: {exc!r}")
        if not dry_run:
            self._count(result)
        return result

    async def _lookup(
        self, scope: CacheScope, question: str, threshold: float, k: int
    ) -> LookupResult:
        exact = await self.store.get_exact(scope, question)
        if exact is not None:
            checked = CheckedCandidate(exact, Verdict(True), True)
            return LookupResult("hit", threshold, scope, question, exact, candidates=[checked])
        # Past the embedder's window two prompts can share every embedded token:
        # such long prompts use the exact tier only (and are embedded only if stored).
        if not self.embedder.fits(question):
            return LookupResult(
                "miss",
                threshold,
                scope,
                question,
                reason="prompt longer than the embedder's window: exact tier only",
            )
        vector = await self.embedder.embed(question)
        result = LookupResult("miss", threshold, scope, question, vector=vector)
        for candidate in await self.store.search(scope, vector, k):
            above = candidate.similarity >= threshold
            verdict = self.guard.check(candidate.entry.prompt, question)
            result.candidates.append(CheckedCandidate(candidate, verdict, above))
            if above and verdict.ok and result.hit is None:
                result.status, result.hit = "hit", candidate
        return result

    def _count(self, result: LookupResult) -> None:
        if result.best is not None and result.best.candidate.tier == "semantic":
            self.stats.observe_similarity(result.best.candidate.similarity)
        rejected = [c for c in result.candidates if c.above_threshold and not c.verdict.ok]
        if rejected:
            self.stats.guard_rejections += 1
            self.stats.rejections_by_rule[rejected[0].verdict.rule or "?"] += 1
        if result.hit is None:
            self.stats.misses += 1
            return
        if result.hit.tier == "exact":
            self.stats.hits_exact += 1
        else:
            self.stats.hits_semantic += 1
        # The event loop keeps only weak references to tasks: hold it until it is done.
        task = asyncio.get_running_loop().create_task(self._record_hit(result.hit.entry.id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record_hit(self, entry_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.store.record_hit(entry_id)

    async def store_answer(
        self,
        request: CacheRequest,
        outcome: CompletionOutcome,
        vector: np.ndarray | None = None,
        ttl: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> CacheEntry | None:
        """Stores a finished answer if the policy allows; never raises (fail open)."""
        decision = self.policy.may_store(request, outcome)
        if not decision.allowed:
            self.stats.store_skips += 1
            return None
        metadata = {"finish_reason": outcome.finish_reason, **(metadata or {})}
        try:
            entry = await asyncio.wait_for(
                self._put(request, outcome.text, vector, ttl, metadata), self.timeout
            )
        except Exception as exc:
            self.stats.errors[f"store_{_error_kind(exc)}"] += 1
            log.warning("cache store failed (answer still served): %r", exc)
            return None
        self.stats.stores += 1
        return entry

    async def seed(
        self,
        question: str,
        answer: str,
        model: str,
        tenant: str = "default",
        context: list[dict[str, str]] | None = None,
        ttl: int | None = None,
    ) -> CacheEntry:
        """Warms the cache with a known question and answer (errors propagate: an
        operator asked for this)."""
        if not question.strip() or not answer.strip():
            raise ValueError("seeding needs a non-empty question and answer")
        request = CacheRequest(
            model=model,
            tenant=tenant,
            messages=[*(context or []), {"role": "user", "content": question}],
        )
        return await self._put(
            request, answer, None, ttl, {"finish_reason": "stop", "seeded": True}
        )

    async def _put(
        self,
        request: CacheRequest,
        answer: str,
        vector: np.ndarray | None,
        ttl: int | None,
        metadata: dict[str, Any],
    ) -> CacheEntry:
        question = self.policy.question(request)
        assert question is not None
        if vector is None:
            vector = await self.embedder.embed(question)
        return await self.store.put(
            self.policy.scope(request),
            question,
            answer,
            vector,
            ttl=ttl if ttl is not None else self.default_ttl,
            metadata=metadata,
        )

    async def follow_or_lead(
        self,
        request: CacheRequest,
        lookup: LookupResult,
        produce: Callable[[], AsyncIterator[Any]],
        variant: Hashable = None,
        codec: Codec | None = None,
    ) -> tuple[bool, AsyncIterator[Any]]:
        """On a miss: join an equivalent flight in progress (returns (False, stream)) or
        start one running `produce()` (returns (True, stream)). Only flights of the same
        `variant` are joined: callers put there what shapes the answer beyond the question
        (a length limit, stop sequences), so no one follows an answer cut shorter than
        their own would be.

        With a `codec` (encode, decode of a chunk), flights are shared with other processes
        over Redis too, for the same exact question and variant: the leader publishes its
        chunks, a follower elsewhere decodes them live (and if that leader is lost before
        its first chunk, runs `produce()` itself)."""
        scope, question = lookup.scope, lookup.question
        if scope is None or question is None:
            return True, produce()
        key = (scope, variant)
        exact_key = self.store.entry_id(scope, question)
        flight = self.singleflight.find(key, exact_key, question, lookup.vector, lookup.threshold)
        if flight is not None:
            self.stats.coalesced += 1
            return False, flight.subscribe()
        if codec is None:
            flight = self.singleflight.start(key, exact_key, question, lookup.vector, produce)
            return True, flight.subscribe()
        # The local flight is registered before the claim's round trip, so equivalent
        # requests in this process join it instead of claiming again; its source (which
        # leads or follows the shared flight) awaits the same claim.
        flight_id = SharedFlights.flight_id(exact_key, variant)
        claiming = asyncio.ensure_future(self.shared_flights.claim(flight_id))
        source = partial(self._shared_source, claiming, produce, codec)
        flight = self.singleflight.start(key, exact_key, question, lookup.vector, source)
        stream = flight.subscribe()
        claim = await asyncio.shield(claiming)
        if not claim.leader:
            self.stats.coalesced += 1
            self.stats.coalesced_remote += 1
        return claim.leader, stream

    async def _shared_source(
        self,
        claiming: asyncio.Future[Claim],
        produce: Callable[[], AsyncIterator[Any]],
        codec: Codec,
    ) -> AsyncIterator[Any]:
        claim = await claiming
        encode, decode = codec
        if not claim.leader:
            stream = self._follow_remote(claim, decode, produce)
        elif claim.shared:
            stream = self.shared_flights.publish(claim, produce(), encode)
        else:
            stream = produce()
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await aclose(stream)  # closing this flight's source aborts the upstream

    async def _follow_remote(
        self,
        claim: Claim,
        decode: Callable[[bytes], Any],
        produce: Callable[[], AsyncIterator[Any]],
    ) -> AsyncIterator[Any]:
        """Another process's flight, decoded. Lost before its first chunk, this process
        answers itself; lost after, the loss is this stream's error."""
        followed = False
        try:
            async for payload in self.shared_flights.follow(claim):
                followed = True
                yield decode(payload)
            return
        except FlightLost as exc:
            self.stats.errors["flight_lost"] += 1
            if followed:
                raise
            log.warning("shared flight lost before its first chunk, answering here: %s", exc)
        stream = produce()
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await aclose(stream)


class CacheRuntime:
    """Owns what the cache needs at run time: Redis (embedded unless a URL is given),
    the embedder and the store. `async with CacheRuntime(...) as cache:`."""

    def __init__(
        self,
        redis_url: str | None = None,
        data_dir: Path | None = None,
        maxmemory: str = "512mb",
        embedder: Embedder | None = None,
        index_name: str = "semgate",
        **cache_options: Any,
    ) -> None:
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.maxmemory = maxmemory
        self.embedder = embedder
        self.index_name = index_name
        self.cache_options = cache_options
        self.server: EmbeddedRedis | None = None
        self.store: CacheStore | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._own_embedder = embedder is None

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
            emb = self.embedder
            self.store = CacheStore(url, emb.model_id, emb.dims, self.index_name)
            await self.store.connect()
        except BaseException:
            await self.__aexit__()
            raise
        return SemanticCache(self.store, self.embedder, **self.cache_options)

    async def __aexit__(self, *exc: object) -> None:
        if self.store is not None:
            await self.store.close()
        if self._own_embedder and self.embedder is not None:
            self.embedder.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
        if self._tmp is not None:
            self._tmp.cleanup()

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
from collections.abc import AsyncGenerator, Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import redis.exceptions

from cache.circuit_breaker import CircuitBreaker
from cache.embedder import Embedder
from cache.guard import Guard, LanguageGuard, cross_encoder
from cache.language import language
from cache.multilingual_embedder import MultilingualEmbedder
from cache.policy import CachePolicy, CacheRequest, CacheScope, CompletionOutcome
from cache.redis_server import EmbeddedRedis, check_redis_url
from cache.shared_flight import Claim, Codec, FlightLost, SharedFlights, aclose
from cache.singleflight import SingleFlight
from cache.stats import CacheStats
from cache.store import (
    DEFAULT_MAX_CONNECTIONS,
    ENGLISH_VECTOR,
    CacheEntry,
    CacheStore,
    Candidate,
)
from cache.supervisor import RedisSupervisor
from cache.thresholds import Thresholds
from cache.tiers import (
    CheckedCandidate,
    ExactTier,
    Question,
    SemanticTier,
    Tier,
    english_tier,
    multilingual_field,
    multilingual_tier,
)

log = logging.getLogger(__name__)

# Questions longer than this are keyed and measured in a worker thread, so that one huge
# prompt does not hold up every other request on the event loop.
INLINE_KEY_CHARS = 20_000
# Conversations longer than this have their scope (a hash of every earlier turn: 260 ms
# for 100,000 messages) fingerprinted in a worker thread too.
INLINE_MESSAGES = 100

Status = Literal["hit", "miss", "bypass", "error"]
T = TypeVar("T")


async def _sized(text: str, work: Callable[..., T], *args: Any) -> T:
    """work(*args) on the event loop, or in a worker thread when `text` is long
    (normalizing it for the key takes ~20 ms per 1 MB, tokenizing it longer)."""
    if len(text) > INLINE_KEY_CHARS:
        return await asyncio.to_thread(work, *args)
    return work(*args)


@dataclass
class LookupResult:
    status: Status
    threshold: float
    scope: CacheScope | None = None
    question: str | None = None
    hit: Candidate | None = None
    reason: str | None = None  # bypass or error reason
    candidates: list[CheckedCandidate] = field(default_factory=list)
    exact_key: str | None = None  # the entry id this question has in its scope
    language: str | None = None
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # by tier's vector field
    embed_seconds: float | None = None  # the question's embedding, when it was embedded

    @property
    def vector(self) -> np.ndarray | None:
        """The English tier's vector of the question, when it has one (in-process
        single-flight compares these)."""
        return self.vectors.get(ENGLISH_VECTOR)

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
        redis: RedisSupervisor | None = None,
        multilingual: MultilingualEmbedder | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """Without a `multilingual` embedder (or a store with its vector field), questions
        in other languages than English get the exact tier only."""
        self.store = store
        self.redis = redis  # its state: while Redis is down, the cache is not asked
        # Skips a Redis that hangs (the supervisor sees only one that exits or refuses).
        self.breaker = breaker or CircuitBreaker()
        self.embedder = embedder
        self.thresholds = thresholds or Thresholds()
        self.policy = policy or CachePolicy()
        self.guard = guard if guard is not None else Guard()
        self.guard.load()
        self.tiers: list[Tier] = [ExactTier(store), english_tier(store, embedder, self.guard)]
        if multilingual is not None and any(
            f.embedder_id == multilingual.model_id for f in store.vectors
        ):
            self.tiers.append(multilingual_tier(store, multilingual, LanguageGuard()))
        self.default_ttl = default_ttl
        self.timeout = timeout
        self.candidates = candidates
        self.stats = CacheStats()
        self.singleflight: SingleFlight[Any] = SingleFlight(self.guard)
        self.shared_flights = shared_flights or SharedFlights(store.client, timeout=timeout)
        self._background: set[asyncio.Task[None]] = set()  # hit counters in flight

    def snapshot(self) -> dict[str, Any]:
        """The counters, each tier's description, and for each language the tier that
        serves it semantically ("exact only" for a language nothing is fitted for)."""
        snapshot = self.stats.snapshot()
        seen = snapshot["languages"]
        languages: dict[str, dict[str, Any]] = {}
        for tier in self.tiers:
            if not isinstance(tier, SemanticTier):
                continue
            for lang in tier.languages:
                threshold = tier.threshold(lang)
                languages[lang] = {
                    "tier": tier.name,
                    "threshold": self.thresholds.default if threshold is None else threshold,
                }
        for lang in seen:
            languages.setdefault(lang, {"tier": "exact only"})
        for lang, description in languages.items():
            description |= {"lookups": 0, "hits": 0} | seen.get(lang, {})
        return snapshot | {
            "tiers": {tier.name: tier.stats() for tier in self.tiers},
            "languages": dict(sorted(languages.items())),
        }

    @property
    def down_reason(self) -> str | None:
        """Why Redis cannot be used now (the supervisor says it is down, or the breaker
        is open), else None."""
        if self.redis is not None and not self.redis.up:
            return self.redis.down_reason or "Redis is down"
        return self.breaker.reason

    def _skip_reason(self) -> str | None:
        """Why this lookup must not ask Redis (down_reason, less the breaker's probe)."""
        if self.redis is not None and not self.redis.up:
            return self.redis.down_reason or "Redis is down"
        return None if self.breaker.allows() else self.breaker.reason

    def threshold_for(self, scope: CacheScope) -> float:
        return self.thresholds.for_scope(scope.tenant, scope.model)

    async def lookup(
        self,
        request: CacheRequest,
        dry_run: bool = False,
        threshold: float | None = None,
        candidates: int | None = None,
        accept: Callable[[CacheEntry], bool] | None = None,
    ) -> LookupResult:
        """Exact tier, then semantic tier + guard over the `candidates` nearest entries. A
        dry run changes no counters and no hit counts, and reports every candidate with its
        similarity and verdict. `accept` is what the caller can serve (say, within its
        length limit): a refused entry is passed over for the next candidate, and never
        counted as a hit."""
        decision = self.policy.may_lookup(request)
        if not decision.allowed:
            if not dry_run:
                self.stats.bypasses += 1
            return LookupResult("bypass", threshold or 0.0, reason=decision.reason)
        if (down := self._skip_reason()) is not None:
            # Not asked (a bypass, not a failed lookup): each lookup would wait for its
            # connection to fail, and log it, for as long as the outage lasts.
            if not dry_run:
                self.stats.bypasses += 1
            return LookupResult("bypass", threshold or 0.0, reason=f"Redis is down: {down}")
        question = self.policy.question(request)
        assert question is not None
        if len(request.messages) > INLINE_MESSAGES:
            scope = await asyncio.to_thread(self.policy.scope, request)
        else:
            scope = self.policy.scope(request)
        exact_key = await _sized(question, self.store.entry_id, scope, question)
        threshold = self.threshold_for(scope) if threshold is None else threshold
        if not dry_run:
            self.stats.lookups += 1
        asked: Question | None = None
        try:
            # asyncio.timeout runs the lookup in this task (wait_for wraps it in another).
            async with asyncio.timeout(self.timeout):
                lang = await _sized(question, language, question)
                asked = Question(question, scope, exact_key, lang, threshold)
                result = await self._lookup(asked, candidates or self.candidates, accept, dry_run)
        except Exception as exc:
            kind = _error_kind(exc)
            if kind == "timeout" and asked is not None and asked.waiting_on == "redis":
                self.breaker.record_timeout()
            if not dry_run:
                self.stats.errors[kind] += 1
            log.warning("cache lookup failed open (%s): %r", kind, exc)
            reason = f"{kind}: {exc!r}"
            return LookupResult(
                "error", threshold, scope, question, reason=reason, exact_key=exact_key
            )
        self.breaker.record_success()
        if not dry_run:
            self._count(result)
        return result

    async def _lookup(
        self,
        question: Question,
        k: int,
        accept: Callable[[CacheEntry], bool] | None,
        dry_run: bool,
    ) -> LookupResult:
        """Asks each tier that serves the question, in order, until one hits."""
        result = LookupResult(
            "miss",
            question.threshold,
            question.scope,
            question.text,
            exact_key=question.exact_key,
            language=question.language,
            vectors=question.vectors,
        )
        for tier in self.tiers:
            if not tier.serves(question):
                continue
            found = await tier.lookup(question, k, accept, dry_run)
            result.candidates += found.candidates
            result.reason = found.reason or result.reason
            if found.hit is not None:
                result.status, result.hit = "hit", found.hit
                break
        result.embed_seconds = question.embed_seconds
        return result

    def _count(self, result: LookupResult) -> None:
        semantic = [c for c in result.candidates if c.candidate.tier != "exact"]
        if semantic:
            self.stats.observe_similarity(semantic[0].candidate.similarity)
        rejected = [c.verdict for c in result.candidates if c.rejected]
        if rejected:
            self.stats.guard_rejections += 1
            self.stats.rejections_by_rule[rejected[0].rule or "?"] += 1
        self.stats.observe_language(result.language or "und", hit=result.hit is not None)
        if result.hit is None:
            self.stats.misses += 1
            return
        self.stats.hits_by_tier[result.hit.tier] += 1
        self.stats.observe_saved(result.hit.entry)
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
        lookup: LookupResult | None = None,
        ttl: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> CacheEntry | None:
        """Stores a finished answer if the policy allows; never raises (fail open). The
        request's `lookup`, when given, lends its scope, key and vector (no second
        hashing of the conversation, no second embedding)."""
        decision = self.policy.may_store(request, outcome)
        if not decision.allowed or self.down_reason is not None:
            self.stats.store_skips += 1
            return None
        metadata = {"finish_reason": outcome.finish_reason, **(metadata or {})}
        try:
            async with asyncio.timeout(self.timeout):
                entry = await self._put(request, outcome.text, lookup, ttl, metadata)
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
        usage: dict[str, int] | None = None,
    ) -> CacheEntry:
        """Warms the cache with a known question and answer (errors propagate: an
        operator asked for this). `usage` is the answer's prompt_tokens and
        completion_tokens as the model would count them, as a generated entry has them;
        without it the entry's length is unknown."""
        if not question.strip() or not answer.strip():
            raise ValueError("seeding needs a non-empty question and answer")
        request = CacheRequest(
            model=model,
            tenant=tenant,
            messages=[*(context or []), {"role": "user", "content": question}],
        )
        metadata = {"finish_reason": "stop", "seeded": True, **(usage or {})}
        return await self._put(request, answer, None, ttl, metadata)

    async def _put(
        self,
        request: CacheRequest,
        answer: str,
        lookup: LookupResult | None,
        ttl: int | None,
        metadata: dict[str, Any],
    ) -> CacheEntry:
        if lookup is None or lookup.scope is None or lookup.question is None:
            question = self.policy.question(request)
            lookup = LookupResult("miss", 0.0, self.policy.scope(request), question)
        assert lookup.scope is not None and lookup.question is not None
        asked = Question(
            lookup.question,
            lookup.scope,
            lookup.exact_key or self.store.entry_id(lookup.scope, lookup.question),
            lookup.language or await _sized(lookup.question, language, lookup.question),
            lookup.threshold,
            dict(lookup.vectors),
        )
        vectors: dict[str, np.ndarray] = {}
        for tier in self.tiers:
            if tier.serves(asked):
                vectors |= await tier.store(asked)
        return await self.store.put(
            asked.scope,
            asked.text,
            answer,
            vectors.pop(ENGLISH_VECTOR, None),
            ttl=ttl if ttl is not None else self.default_ttl,
            # The guard detects it again (cached) when it checks; kept for the operator.
            metadata={**metadata, "language": asked.language},
            entry_id=asked.exact_key,
            language=asked.language,
            vectors=vectors,
        )

    async def follow_or_lead(
        self,
        request: CacheRequest,
        lookup: LookupResult,
        produce: Callable[[], AsyncGenerator[Any, None]],
        variant: Hashable = None,
        codec: Codec | None = None,
    ) -> tuple[bool, AsyncGenerator[Any, None]]:
        """On a miss: join an equivalent flight in progress (returns (False, stream)) or
        start one running `produce()` (returns (True, stream)). Only flights of the same
        `variant` are joined: callers put there what shapes the answer beyond the question
        (a length limit, stop sequences), so no one follows an answer cut shorter than
        their own would be.

        With a `codec` (encode, decode of a chunk), flights are shared with other processes
        over Redis too, for the same exact question and variant: the leader publishes its
        chunks, a follower elsewhere decodes them live (and if that leader is lost before
        its first chunk, runs `produce()` itself)."""
        scope, question, exact_key = lookup.scope, lookup.question, lookup.exact_key
        if scope is None or question is None or exact_key is None:
            return True, produce()
        key = (scope, variant)
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
        produce: Callable[[], AsyncGenerator[Any, None]],
        codec: Codec,
    ) -> AsyncGenerator[Any, None]:
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
        produce: Callable[[], AsyncGenerator[Any, None]],
    ) -> AsyncGenerator[Any, None]:
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

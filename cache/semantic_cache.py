"""The cache as the gateway sees it: lookup (exact tier, semantic tiers and their
guards) and storing, both asking the policy first, with stats, over the store and the
embedders. Concurrent misses coalesce through `coalescer` (cache/coalescer.py).

Fail open: any Redis or embedder failure, a lookup slower than `timeout` (not counting
its wait for the embedder, bounded by the embedder's queue: cache/tiers.py), or an
embedder too busy to queue the question, is a miss (status "error", counted by kind);
a failed store is logged and counted. While Redis is down (its supervisor says so, or
the circuit breaker is open after lookups that timed out on it) the cache is not asked:
a bypass. The request is always answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import redis.exceptions

from cache.coalescer import Coalescer
from cache.embedder import Embedder, EmbedderBusy
from cache.entry import CacheEntry
from cache.guard import Guard, LanguageGuard
from cache.language import language
from cache.lookup_result import LookupResult
from cache.multilingual_embedder import MultilingualEmbedder
from cache.policy import CachePolicy, CacheRequest, CacheScope, CompletionOutcome
from cache.shared_flights import SharedFlights
from cache.stats import CacheStats
from cache.store import ENGLISH_VECTOR, CacheStore
from cache.supervisor import RedisSupervisor
from cache.thresholds import Thresholds
from cache.tiers import (
    ExactTier,
    Question,
    SemanticTier,
    Tier,
    english_tier,
    multilingual_tier,
)
from resilience.circuit_breaker import CircuitBreaker

log = logging.getLogger(__name__)

# Questions longer than this are keyed and measured in a worker thread, so that one huge
# prompt does not hold up every other request on the event loop.
INLINE_KEY_CHARS = 20_000
# Conversations longer than this have their scope (a hash of every earlier turn: 260 ms
# for 100,000 messages) fingerprinted in a worker thread too.
INLINE_MESSAGES = 100

T = TypeVar("T")


async def _sized(text: str, work: Callable[..., T], *args: Any) -> T:
    """work(*args) on the event loop, or in a worker thread when `text` is long
    (normalizing it for the key takes ~20 ms per 1 MB, tokenizing it longer)."""
    if len(text) > INLINE_KEY_CHARS:
        return await asyncio.to_thread(work, *args)
    return work(*args)


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, EmbedderBusy):
        return "busy"
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
        self.coalescer: Coalescer[Any] = Coalescer(
            self.guard, shared_flights or SharedFlights(store.client, timeout=timeout), self.stats
        )
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
        exact_missed: Callable[[], object] | None = None,
    ) -> LookupResult:
        """Exact tier, then semantic tier + guard over the `candidates` nearest entries. A
        dry run changes no counters and no hit counts, and reports every candidate with its
        similarity and verdict. `accept` is what the caller can serve (say, within its
        length limit): a refused entry is passed over for the next candidate, and never
        counted as a hit. `exact_missed` is called once the exact tier has missed, before
        the semantic tiers are asked (the gateway starts its engine request then)."""
        if (bypass := self.policy.may_lookup(request)) is not None:
            if not dry_run:
                self.stats.bypasses += 1
            return LookupResult("bypass", threshold or 0.0, reason=bypass.detail)
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
            async with asyncio.timeout(self.timeout) as deadline:
                lang = await _sized(question, language, question)
                asked = Question(question, scope, exact_key, lang, threshold, deadline=deadline)
                k = candidates or self.candidates
                result = await self._lookup(asked, k, accept, dry_run, exact_missed)
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
        exact_missed: Callable[[], object] | None = None,
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
            if exact_missed is not None and isinstance(tier, ExactTier):
                exact_missed()
        result.embed_seconds = question.embed_seconds
        return result

    def _count(self, result: LookupResult) -> None:
        semantic = [c for c in result.candidates if c.candidate.tier != "exact"]
        if semantic:
            self.stats.observe_similarity(semantic[0].candidate.similarity)
        rejected = [c.verdict for c in result.candidates if c.verdict is not None and c.rejected]
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
        if self.policy.may_store(request, outcome) is not None or self.down_reason is not None:
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
        # `if`, not `or`: mypy types the call after `or` by what comes before (str | None).
        asked = Question(
            lookup.question,
            lookup.scope,
            lookup.exact_key or self.store.entry_id(lookup.scope, lookup.question),
            lookup.language
            if lookup.language
            else await _sized(lookup.question, language, lookup.question),
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

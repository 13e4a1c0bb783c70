"""The cache's tiers, asked in order: each an object that looks a question up, says what it
keeps of a stored answer, and reports its own numbers.

- `exact`: the normalised question in its scope (one HMGET).
- `semantic-english`: English questions, the bundled English embedder's vectors, the
  English guard (certain rules, then the verifier's English model), above the
  configured threshold.
- `semantic-multilingual`: questions in a language the verifier's multilingual model has
  a threshold for, the multilingual embedder's vectors, only entries in the question's
  own language (a cached answer is in its asker's language), the checks that hold in
  any language, then the multilingual model.

A question in any other language keeps the exact tier only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from cache.embedder import Embedder
from cache.entry import CacheEntry, Candidate
from cache.guard import Guard, LanguageGuard, Verdict
from cache.language import ENGLISH
from cache.multilingual_embedder import MultilingualEmbedder
from cache.policy import CacheScope
from cache.store import MULTILINGUAL_VECTOR, CacheStore, VectorField

EXACT, ENGLISH_TIER, MULTILINGUAL_TIER = "exact", "semantic-english", "semantic-multilingual"
# A lookup's embedding queues behind at most this many texts, or the lookup fails open
# at once ("busy"): ~64 x 3-6 ms over two workers is 0.1-0.2 s of waiting. Within that
# bound the wait is not charged to the lookup's deadline (the engine answers a miss
# meanwhile, and a hit inside a burst is what the cache is for), up to EMBED_WAIT_S.
EMBED_QUEUE_LIMIT = 64
EMBED_WAIT_S = 5.0


@dataclass
class Question:
    """What a lookup knows of a question, filled in as the tiers go."""

    text: str
    scope: CacheScope
    exact_key: str
    language: str
    threshold: float  # the English tier's similarity threshold for this scope
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # by vector field
    embed_seconds: float | None = None
    # What the lookup awaits now: a timeout while Redis is awaited feeds the circuit
    # breaker (resilience/circuit_breaker.py), one while the embedder is does not.
    waiting_on: Literal["redis", "embedder"] | None = None
    deadline: asyncio.Timeout | None = None  # the lookup's own (SemanticCache.timeout)

    @contextmanager
    def embedder_wait(self) -> Iterator[None]:
        """The deadline stands still while the embedder is waited for (EMBED_WAIT_S at
        most), and goes on with the time it had left once the vector is there."""
        if self.deadline is None or (when := self.deadline.when()) is None:
            yield
            return
        loop = asyncio.get_running_loop()
        left = when - loop.time()
        self.deadline.reschedule(loop.time() + EMBED_WAIT_S)
        yield
        self.deadline.reschedule(loop.time() + left)


@dataclass(frozen=True)
class CheckedCandidate:
    candidate: Candidate
    # None: not checked. A live lookup asks the guard only about candidates that could
    # still be served (above the threshold, servable, no hit yet); a dry run asks always.
    verdict: Verdict | None
    above_threshold: bool

    @property
    def rejected(self) -> bool:
        """Above the threshold, but the guard said no."""
        return self.above_threshold and self.verdict is not None and not self.verdict.ok


@dataclass
class TierResult:
    candidates: list[CheckedCandidate] = field(default_factory=list)
    hit: Candidate | None = None
    reason: str | None = None  # why the tier was not asked


Accept = Callable[[CacheEntry], bool] | None
TOO_LONG = "prompt longer than the embedder's window: exact tier only"
_NO_SCOPE = CacheScope("", "", "")


class Tier(Protocol):
    name: str

    def serves(self, question: Question) -> bool:
        """Whether this tier looks the question up and keeps something of its answer."""
        ...

    async def lookup(
        self, question: Question, k: int, accept: Accept, dry_run: bool
    ) -> TierResult: ...

    async def store(self, question: Question) -> dict[str, np.ndarray]:
        """What this tier keeps of an answer to `question`: vectors by field."""
        ...

    def stats(self) -> dict[str, Any]:
        """What the tier serves (its hits are counted by name in CacheStats)."""
        ...


class ExactTier:
    name = EXACT

    def __init__(self, store: CacheStore) -> None:
        self.entries = store

    def serves(self, question: Question) -> bool:
        return True

    async def lookup(self, question: Question, k: int, accept: Accept, dry_run: bool) -> TierResult:
        question.waiting_on = "redis"
        exact = await self.entries.get_exact(question.exact_key)
        if exact is None or (accept is not None and not accept(exact.entry)):
            return TierResult()
        return TierResult([CheckedCandidate(exact, Verdict(True), True)], exact)

    async def store(self, question: Question) -> dict[str, np.ndarray]:
        return {}  # the entry's id is the exact key

    def stats(self) -> dict[str, Any]:
        return {"languages": "all"}


@dataclass(eq=False)
class SemanticTier:
    """KNN over one embedder's vectors within the scope, then a guard per candidate.
    `thresholds` gives a question's similarity threshold; `own_language_only` keeps a
    question to entries in its own language."""

    name: str
    entries: CacheStore
    embedder: Embedder | MultilingualEmbedder
    field: VectorField
    guard: Guard | LanguageGuard
    languages: frozenset[str]
    thresholds: Callable[[Question], float]
    own_language_only: bool

    def serves(self, question: Question) -> bool:
        return question.language in self.languages

    async def vector(self, question: Question) -> np.ndarray | None:
        """The question's vector in this tier (embedded once per lookup), or None when it
        is too long to be embedded whole: past the window two texts can share every
        embedded token, so such a question gets the exact tier only."""
        if self.field.name in question.vectors:
            return question.vectors[self.field.name]
        if not self.embedder.fits(question.text):
            return None
        started = time.perf_counter()
        question.waiting_on = "embedder"
        with question.embedder_wait():
            vector = await self.embedder.embed(question.text, EMBED_QUEUE_LIMIT)
        question.embed_seconds = time.perf_counter() - started
        question.vectors[self.field.name] = vector
        return vector

    async def lookup(self, question: Question, k: int, accept: Accept, dry_run: bool) -> TierResult:
        vector = await self.vector(question)
        if vector is None:
            return TierResult(reason=TOO_LONG)
        language = question.language if self.own_language_only else None
        question.waiting_on = "redis"
        found = await self.entries.search(
            question.scope, vector, k, self.field, language, self.name
        )
        threshold = self.thresholds(question)
        result = TierResult()
        for candidate in found:
            above = candidate.similarity >= threshold
            servable = accept is None or accept(candidate.entry)
            # On a typical miss (nothing above the threshold) a live lookup skips the
            # guard. Its check runs on a thread: the English verifier's cross-encoder takes
            # ~4.5 ms in int8 (~10 ms in float32) when it runs, the rules ~0.5 ms.
            decides = above and servable and result.hit is None
            verdict = (
                await asyncio.to_thread(
                    self.guard.check, candidate.entry.prompt, question.text, candidate.similarity
                )
                if decides or dry_run
                else None
            )
            result.candidates.append(CheckedCandidate(candidate, verdict, above))
            if decides and verdict is not None and verdict.ok:
                result.hit = candidate
        return result

    async def store(self, question: Question) -> dict[str, np.ndarray]:
        vector = await self.vector(question)
        return {} if vector is None else {self.field.name: vector}

    def stats(self) -> dict[str, Any]:
        return {"embedder": self.field.embedder_id, "languages": sorted(self.languages)}

    def threshold(self, language: str) -> float | None:
        """The fitted similarity threshold of a language, where it has its own."""
        if self.own_language_only:
            return self.thresholds(Question("", _NO_SCOPE, "", language, 0.0))
        return None


def english_tier(store: CacheStore, embedder: Embedder, guard: Guard) -> SemanticTier:
    return SemanticTier(
        ENGLISH_TIER,
        store,
        embedder,
        store.vectors[0],
        guard,
        frozenset({ENGLISH}),
        thresholds=lambda question: question.threshold,
        # Entries in other languages have no vector of this tier's.
        own_language_only=False,
    )


def multilingual_tier(
    store: CacheStore, embedder: MultilingualEmbedder, guard: LanguageGuard
) -> SemanticTier:
    (field,) = (f for f in store.vectors if f.embedder_id == embedder.model_id)
    thresholds = guard.verifier.thresholds
    return SemanticTier(
        MULTILINGUAL_TIER,
        store,
        embedder,
        field,
        guard,
        guard.languages,
        thresholds=lambda question: thresholds[question.language],
        own_language_only=True,
    )


def multilingual_field(embedder: MultilingualEmbedder) -> VectorField:
    return VectorField(
        MULTILINGUAL_VECTOR, embedder.dims, "embedder_multilingual", embedder.model_id
    )

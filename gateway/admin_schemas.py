"""The admin API's responses as msgspec Structs, so the OpenAPI document describes them
(the request bodies live beside their handlers in gateway/routes/admin.py)."""

from __future__ import annotations

from typing import Any

import msgspec

from cache.entry import CacheEntry


class EntryView(msgspec.Struct):
    id: str
    question: str
    answer: str
    tenant: str
    model: str
    context: str  # the fingerprint of the earlier turns ("" for a first question)
    created: float  # Unix time
    hits: int
    ttl: int | None  # seconds left; None: never expires
    metadata: dict[str, Any]  # finish_reason, language, prompt_tokens, completion_tokens, seeded,
    # generation_seconds (how long a generated answer took: what a hit on it saves)

    @classmethod
    def of(cls, e: CacheEntry) -> EntryView:
        return cls(e.id, e.prompt, e.response, e.tenant, e.model, e.context, e.created,
                   e.hits, e.ttl, e.metadata)  # fmt: skip


class HitView(EntryView):
    similarity: float

    @classmethod
    def of_hit(cls, e: CacheEntry, similarity: float) -> HitView:
        return cls(**msgspec.structs.asdict(EntryView.of(e)), similarity=similarity)


class EntryPage(msgspec.Struct):
    total: int
    offset: int
    data: list[EntryView]


class GuardView(msgspec.Struct):
    ok: bool
    rule: str | None  # the rule that rejected the candidate
    detail: str


class CandidateView(msgspec.Struct):
    id: str
    question: str
    similarity: float
    tier: str  # "exact" | "semantic-english" | "semantic-multilingual"
    above_threshold: bool
    guard: GuardView | None  # None: the guard was not asked


class LookupView(msgspec.Struct):
    """A dry-run lookup: whether it would hit, and the verdict on each candidate."""

    would_hit: bool
    status: str  # "hit" | "miss" | "bypass" | "error"
    threshold: float
    reason: str | None
    hit: HitView | None
    candidates: list[CandidateView]


class Flushed(msgspec.Struct):
    deleted: int

"""Cache counters, the histogram of best-candidate similarity, and what hits saved."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cache.entry import CacheEntry

# Similarity histogram bucket upper bounds: fine steps where thresholds live.
SIMILARITY_BUCKETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 1.0)


@dataclass
class Saved:
    """What the hits on one tenant's entries of one model saved: the tokens their answers
    did not generate (the entries' stored completion_tokens) or prefill (prompt_tokens,
    their original prompts'), and the seconds their generation took when it was done.
    Entries that lack a count or a time (seeded ones have no time, nor do those stored
    before times were kept) are counted in `hits_without_tokens` / `_seconds`, never
    guessed."""

    hits: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0
    hits_without_tokens: int = 0
    hits_without_seconds: int = 0

    def add(self, entry: CacheEntry) -> None:
        self.hits += 1
        completion = entry.completion_tokens
        if completion is None:
            self.hits_without_tokens += 1
        else:
            self.completion_tokens += completion
        self.prompt_tokens += entry.prompt_tokens or 0
        seconds = entry.generation_seconds
        if seconds is None:
            self.hits_without_seconds += 1
        else:
            self.seconds += seconds


@dataclass
class CacheStats:
    """Lookups = hits + misses + errors; bypasses never reach a lookup."""

    lookups: int = 0
    hits_by_tier: Counter[str] = field(default_factory=Counter)  # by tier name
    misses: int = 0
    bypasses: int = 0
    guard_rejections: int = 0
    coalesced: int = 0  # in-process and cross-process
    coalesced_remote: int = 0  # followed another process's flight through Redis
    stores: int = 0
    store_skips: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by kind: timeout, redis, embedder
    rejections_by_rule: Counter[str] = field(default_factory=Counter)
    similarity_counts: list[int] = field(default_factory=lambda: [0] * len(SIMILARITY_BUCKETS))
    similarity_sum: float = 0.0
    saved: dict[tuple[str, str], Saved] = field(default_factory=dict)  # by (tenant, model)
    # Lookups and hits by the question's language (ISO 639-1; "und" when unknown).
    by_language: dict[str, Counter[str]] = field(default_factory=dict)

    def observe_language(self, language: str, hit: bool) -> None:
        counts = self.by_language.setdefault(language, Counter())
        counts["lookups"] += 1
        counts["hits"] += hit

    def observe_similarity(self, similarity: float) -> None:
        for i, bound in enumerate(SIMILARITY_BUCKETS):
            if similarity <= bound:
                self.similarity_counts[i] += 1
                break
        self.similarity_sum += similarity

    def observe_saved(self, entry: CacheEntry) -> None:
        """A hit on `entry`: what serving it saved, under the entry's tenant and model."""
        self.saved.setdefault((entry.tenant, entry.model), Saved()).add(entry)

    @property
    def hits(self) -> int:
        return sum(self.hits_by_tier.values())

    def snapshot(self) -> dict[str, Any]:
        return {
            "lookups": self.lookups,
            "hits": self.hits,
            "hits_by_tier": dict(self.hits_by_tier),
            "misses": self.misses,
            "bypasses": self.bypasses,
            "guard_rejections": self.guard_rejections,
            "rejections_by_rule": dict(self.rejections_by_rule),
            "coalesced": self.coalesced,
            "coalesced_remote": self.coalesced_remote,
            "stores": self.stores,
            "store_skips": self.store_skips,
            "errors": dict(self.errors),
            "hit_rate": self.hits / self.lookups if self.lookups else 0.0,
            "best_similarity_histogram": {
                "buckets": list(SIMILARITY_BUCKETS),
                "counts": list(self.similarity_counts),
                "sum": self.similarity_sum,
            },
            "saved": self._saved_snapshot(),
            "languages": {lang: dict(c) for lang, c in sorted(self.by_language.items())},
        }

    def _saved_snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{tenant: {model: Saved's fields}}: nested dicts, which replicas add up."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (tenant, model), saved in sorted(self.saved.items()):
            out.setdefault(tenant, {})[model] = asdict(saved)
        return out

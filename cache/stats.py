"""Cache counters and the histogram of best-candidate similarity."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Similarity histogram bucket upper bounds: fine steps where thresholds live.
SIMILARITY_BUCKETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 1.0)


@dataclass
class CacheStats:
    """Lookups = hits + misses + errors; bypasses never reach a lookup."""

    lookups: int = 0
    hits_exact: int = 0
    hits_semantic: int = 0
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

    def observe_similarity(self, similarity: float) -> None:
        for i, bound in enumerate(SIMILARITY_BUCKETS):
            if similarity <= bound:
                self.similarity_counts[i] += 1
                break
        self.similarity_sum += similarity

    @property
    def hits(self) -> int:
        return self.hits_exact + self.hits_semantic

    def snapshot(self) -> dict[str, Any]:
        return {
            "lookups": self.lookups,
            "hits": self.hits,
            "hits_exact": self.hits_exact,
            "hits_semantic": self.hits_semantic,
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
        }

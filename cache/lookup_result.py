"""What a lookup found: its status, the question's scope, key, language and vectors (which
storing the answer and coalescing misses reuse), and the candidates it checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cache.entry import Candidate
from cache.policy import CacheScope
from cache.store import ENGLISH_VECTOR
from cache.tiers import CheckedCandidate

Status = Literal["hit", "miss", "bypass", "error"]


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
        coalescing compares these)."""
        return self.vectors.get(ENGLISH_VECTOR)

    @property
    def best(self) -> CheckedCandidate | None:
        return self.candidates[0] if self.candidates else None

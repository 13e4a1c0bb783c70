"""A cached answer as the store keeps it (a Redis hash of FIELDS beside its vectors), and a
candidate a lookup found."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from redis.typing import EncodableT, FieldT

# The hash fields of an entry (its vectors are stored beside them).
FIELDS = [
    "prompt",
    "response",
    "tenant",
    "model",
    "context",
    "embedder",
    "created",
    "hits",
    "metadata",
]


@dataclass(frozen=True)
class CacheEntry:
    id: str
    prompt: str
    response: str
    tenant: str
    model: str
    context: str
    embedder: str
    created: float
    hits: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    ttl: int | None = None  # seconds left; None = never expires (or not read)

    @classmethod
    def from_fields(cls, entry_id: str, raw: dict[str, Any]) -> CacheEntry:
        def text(name: str) -> str:
            value = raw.get(name, "")
            return value.decode() if isinstance(value, bytes) else str(value)

        return cls(
            id=entry_id,
            prompt=text("prompt"),
            response=text("response"),
            tenant=text("tenant"),
            model=text("model"),
            context=text("context"),
            embedder=text("embedder"),
            created=float(text("created") or 0),
            hits=int(float(text("hits") or 0)),
            metadata=json.loads(text("metadata") or "{}"),
        )

    @property
    def completion_tokens(self) -> int | None:
        """The stored answer's own length in tokens, when it was counted."""
        return _count(self.metadata.get("completion_tokens"))

    @property
    def prompt_tokens(self) -> int | None:
        """Its original prompt's length in tokens, when it was counted."""
        return _count(self.metadata.get("prompt_tokens"))

    @property
    def generation_seconds(self) -> float | None:
        """How long generating the answer took (the gateway stores it with each answer it
        generates); None for seeded entries and those stored before it was kept."""
        seconds = self.metadata.get("generation_seconds")
        if isinstance(seconds, int | float) and not isinstance(seconds, bool):
            return float(seconds) if math.isfinite(seconds) and seconds >= 0 else None
        return None

    def to_fields(self) -> dict[FieldT, EncodableT]:
        """The hash fields `from_fields` reads back (the vector is stored beside them)."""
        fields: dict[FieldT, EncodableT] = {name: getattr(self, name) for name in FIELDS}
        return {**fields, "metadata": json.dumps(self.metadata, ensure_ascii=False)}


def _count(value: Any) -> int | None:
    """A token count as metadata holds it (JSON: a bool is no count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class Candidate:
    entry: CacheEntry
    similarity: float
    tier: str  # the name of the tier that found it

"""Similarity thresholds: what users set, and the one conversion to redisvl's distance.

Users, the API and the config speak cosine *similarity* in [0, 1] (1 = same
meaning). redisvl and RediSearch speak cosine *distance* = 1 - similarity, in
[0, 2]. These two functions are the only place that converts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_THRESHOLD = 0.60


def distance_from_similarity(similarity: float) -> float:
    return 1.0 - similarity


def similarity_from_distance(distance: float) -> float:
    return 1.0 - distance


def validate_threshold(value: object, what: str = "threshold") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{what} must be a similarity in [0, 1], got {value}")
    return float(value)


@dataclass
class Thresholds:
    """The default similarity threshold plus optional per-model and per-tenant overrides.

    A tenant override wins over a model override, which wins over the default:
    a tenant that needs stricter matching gets it on every model.
    """

    default: float = DEFAULT_THRESHOLD
    per_model: dict[str, float] = field(default_factory=dict)
    per_tenant: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.default = validate_threshold(self.default)
        for name, table in (("model", self.per_model), ("tenant", self.per_tenant)):
            for key, value in table.items():
                table[key] = validate_threshold(value, f"threshold for {name} {key!r}")

    def for_scope(self, tenant: str, model: str) -> float:
        if tenant in self.per_tenant:
            return self.per_tenant[tenant]
        return self.per_model.get(model, self.default)

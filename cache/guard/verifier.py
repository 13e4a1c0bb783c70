"""The verifier: a logistic regression, fitted on the labelled pairs, that decides the grey
zone the certain rules leave (`semgate cache fit` fits it and writes `verifier.json`).

After the certain rules have passed a candidate, its pair is reduced to a few numbers
(the embedder's similarity, how much of the wording the two questions share, and, in
English, which of the guard's grey-zone rules fired and the cross-encoder's logit), and
the verifier serves it when

    1 / (1 + exp(-(intercept + sum(weight * feature)))) >= cut

The cut is the lowest probability at which the fitted pairs still reach the target
precision. Each tier has its own model: English (the bundled English embedder's
similarity, the guard's word features, the cross-encoder) and multilingual (the
multilingual embedder's similarity and character overlap, and a similarity threshold
per language below which no pair of that language is served).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Hashable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from importlib.resources import files

# The precision each model is fitted for, over the pairs it decides (`semgate cache fit`).
TARGET_PRECISION = {"english": 0.98, "multilingual": 0.985}


@dataclass(frozen=True)
class Verifier:
    features: tuple[str, ...]
    weights: tuple[float, ...]
    intercept: float
    cut: float  # the probability a pair needs
    # Per language (multilingual tier): the least similarity a pair needs at all.
    thresholds: dict[str, float] = field(default_factory=dict)

    def probability(self, values: Mapping[str, float]) -> float:
        z = self.intercept + sum(
            w * values[f] for f, w in zip(self.features, self.weights, strict=True)
        )
        return 1.0 / (1.0 + math.exp(-z))

    def admits(self, values: Mapping[str, float]) -> bool:
        return self.probability(values) >= self.cut

    def settled(
        self, values: Mapping[str, float], feature: str, low: float, high: float
    ) -> bool | None:
        """Whether it admits the pair for every value of `feature` in [low, high] (True),
        for none (False), or depends on it (None); `values[feature]` is not read."""
        weight = self.weights[self.features.index(feature)]
        rest = self.intercept + sum(
            w * values[f] for f, w in zip(self.features, self.weights, strict=True) if f != feature
        )
        least, most = sorted((rest + weight * low, rest + weight * high))
        if 1.0 / (1.0 + math.exp(-least)) >= self.cut:
            return True
        if 1.0 / (1.0 + math.exp(-most)) < self.cut:
            return False
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            "features": list(self.features),
            "weights": [round(w, 6) for w in self.weights],
            "intercept": round(self.intercept, 6),
            "cut": round(self.cut, 6),
            "thresholds": self.thresholds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Verifier:
        features, weights = data["features"], data["weights"]
        assert isinstance(features, list) and isinstance(weights, list)
        thresholds = data.get("thresholds") or {}
        assert isinstance(thresholds, dict)
        intercept, cut = data["intercept"], data["cut"]
        assert isinstance(intercept, int | float) and isinstance(cut, int | float)
        if len(features) != len(weights):
            raise ValueError("a verifier needs one weight per feature")
        return cls(
            tuple(map(str, features)),
            tuple(map(float, weights)),
            float(intercept),
            float(cut),
            {str(k): float(v) for k, v in thresholds.items()},
        )


def overlap_features(a: Sequence[str], b: Sequence[str]) -> dict[str, float]:
    """How much two texts share, as sequences of their units (words, or characters for
    text without spaces): `jaccard` of the distinct units, `sequence` difflib's ratio of
    the units in order, and `bigrams` the jaccard of adjacent pairs."""
    return {
        "jaccard": _jaccard(set(a), set(b)),
        "sequence": difflib.SequenceMatcher(None, a, b, autojunk=False).ratio(),
        "bigrams": _jaccard(_pairs(a), _pairs(b)),
    }


def _pairs(units: Sequence[str]) -> set[tuple[str, ...]]:
    return {tuple(units[i : i + 2]) for i in range(len(units) - 1)} or {tuple(units)}


def _jaccard(a: Set[Hashable], b: Set[Hashable]) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def read_verifiers(text: str) -> dict[str, Verifier]:
    """The tiers' verifiers from a file `semgate cache fit --write` wrote (`"tiers"`; beside
    it, `"fitted_on"` records the fit's inputs)."""
    return {name: Verifier.from_dict(data) for name, data in json.loads(text)["tiers"].items()}


# Fitted by `semgate cache fit --write cache/guard/verifier.json`; tests/bench/test_verifier_fit.py
# refits and checks it.
VERIFIERS = read_verifiers(
    files("cache.guard").joinpath("verifier.json").read_text(encoding="utf-8")
)

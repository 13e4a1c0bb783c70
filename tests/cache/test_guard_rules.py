"""The guard's rule registry: each rule rejects its own example, the rules run in the
registered order, and the registry refuses what would break that order."""

from __future__ import annotations

import numpy as np
import pytest

from cache import Embedder, Guard
from cache.guard import REGISTRY, Rule, Verdict, rule
from cache.guard_features import Features


@pytest.mark.parametrize("registered", REGISTRY.values(), ids=lambda r: r.name)
def test_each_rule_rejects_its_example(registered: Rule, embedder: Embedder):
    cached, query = registered.example
    va, vb = embedder.embed_many([cached, query])
    verdict = Guard().check(cached, query, float(np.dot(va, vb)))
    assert not verdict.ok and verdict.rule == registered.name, verdict
    assert verdict.detail


def test_the_rules_run_in_the_registered_order():
    # The first rule to reject names the verdict: a new rule's place is a choice.
    names = tuple(REGISTRY)
    assert names == Guard.RULES
    assert names == (
        "language",
        "numbers",
        "units",
        "negation",
        "polarity",
        "order",
        "entities",
        "literal",
        "contrast",
        "question_type",
        "substitution",
        "modifier",
        "qualifier",
        "overlap",
    )
    assert [r.weighs_similarity for r in REGISTRY.values()] == [False] * 13 + [True]


def test_the_registry_refuses_a_name_twice_and_a_word_rule_after_the_bar():
    def numbers(a: Features, b: Features) -> Verdict | None:
        return None

    def vibes(a: Features, b: Features) -> Verdict | None:
        return None

    with pytest.raises(ValueError, match="registered twice"):
        rule(example=("a", "b"))(numbers)
    with pytest.raises(ValueError, match="word rules run before"):
        rule(example=("a", "b"))(vibes)
    assert "vibes" not in REGISTRY

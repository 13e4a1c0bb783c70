"""The guard's rule registry: each rule rejects its own example (a certain rule on its
own, a grey-zone rule through the verifier, which names what the rule found), the rules
run in the registered order, and the registry refuses what would break that order."""

from __future__ import annotations

import numpy as np
import pytest

from cache import Embedder, Guard
from cache.guard.features import Features
from cache.guard.rules import REGISTRY, Rule, rule
from cache.guard.verdict import VERIFIER, Verdict


@pytest.mark.parametrize("registered", REGISTRY.values(), ids=lambda r: r.name)
def test_each_rule_rejects_its_example(registered: Rule, embedder: Embedder):
    cached, query = registered.example
    va, vb = embedder.embed_many([cached, query])
    verdict = Guard().check(cached, query, float(np.dot(va, vb)))
    if registered.certain:
        assert not verdict.ok and verdict.rule == registered.name, verdict
    else:
        assert not verdict.ok and verdict.rule == VERIFIER, verdict
        assert f"({registered.name}: " in verdict.detail, verdict
    assert verdict.detail
    assert Guard().check(cached, query).rule == registered.name  # the words alone


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
        "question_type",
        "contrast",
        "substitution",
        "modifier",
        "qualifier",
    )
    assert [r.certain for r in REGISTRY.values()] == [True] * 9 + [False] * 4


def test_the_registry_refuses_a_name_twice_and_a_certain_rule_after_the_grey_ones():
    def numbers(a: Features, b: Features) -> Verdict | None:
        return None

    def vibes(a: Features, b: Features) -> Verdict | None:
        return None

    with pytest.raises(ValueError, match="registered twice"):
        rule(example=("a", "b"))(numbers)
    with pytest.raises(ValueError, match="certain rules run before"):
        rule(example=("a", "b"))(vibes)
    assert "vibes" not in REGISTRY

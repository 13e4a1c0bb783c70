"""The overlap bar: the similarity a candidate needs rises with the words it shares."""

from __future__ import annotations

import pytest

from cache import Guard
from cache.guard import features, weighed_overlap
from cache.overlap import DEFAULT_BAR, OverlapBar, word_overlap

CHECK = "How do I check my account balance?"
CHANGE = "How do I change my account balance?"
EGG = (
    "How long do I boil an egg for a fully hard yolk?",
    "How long do I boil an egg for a runny yolk?",
)


def test_word_overlap_counts_shared_words_and_their_order():
    assert word_overlap(("a", "b", "c"), ("a", "b", "c")) == word_overlap(("x",), ("x",))
    overlap = word_overlap(("how", "do", "i", "cook", "rice"), ("rice", "how", "do", "i", "boil"))
    assert overlap.jaccard == pytest.approx(4 / 6)  # {how, do, i, rice} of six words
    assert overlap.sequence == pytest.approx(2 * 3 / 10)  # "how do i" in order, of 5 + 5


def test_the_bar_rises_with_the_overlap():
    bar = OverlapBar(base=0.5, per_jaccard=0.1, per_sequence=0.4)
    few, many = (
        word_overlap(("a", "b", "c"), ("a", "x", "y")),
        word_overlap(("a", "b", "c"), ("a", "b", "y")),
    )
    assert bar.required(few) < bar.required(many)
    assert bar.required(word_overlap(("a",), ("b",))) == pytest.approx(0.5)


def test_a_shared_frame_needs_a_high_similarity():
    verdict = Guard().check(*EGG, similarity=0.9)
    assert not verdict.ok and verdict.rule == "overlap"
    assert "needed by questions sharing 77% of their words" in verdict.detail
    peru = ("What is the capital of Peru?", "What is the largest city of Peru?")
    overlap = weighed_overlap(features(peru[0]), features(peru[1]))
    assert overlap is not None
    needed = DEFAULT_BAR.required(overlap)
    assert 0.7 < needed < 0.99
    assert not Guard().check(*peru, similarity=needed - 0.01).ok
    assert Guard().check(*peru, similarity=needed + 0.01).ok


def test_reworded_questions_need_less():
    reworded = ("How do I remove duplicate rows in pandas?", "drop repeated pandas rows")
    assert Guard().check(*reworded, similarity=0.7).ok
    assert DEFAULT_BAR.required(word_overlap(("a", "b"), ("c", "d"))) < 0.7


def test_function_words_alone_leave_nothing_to_weigh():
    assert (
        Guard()
        .check("What is the boiling point of water?", "what's the boiling point of water", 0.75)
        .ok
    )


def test_the_bar_needs_a_similarity_and_can_be_switched_off():
    assert Guard().check(*EGG).ok  # the word rules alone pass it
    rules = tuple(r for r in Guard.RULES if r != "overlap")
    assert Guard(rules=rules).check(*EGG, similarity=0.8).ok
    assert not Guard().check(CHECK, CHANGE, similarity=0.99).ok  # the substitution rule

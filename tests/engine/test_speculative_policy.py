"""The proposers' and the adaptive policy's logic, without a model."""

from __future__ import annotations

from engine.speculative.ngram import NgramIndex
from engine.speculative.policy import PROBE_EVERY, SpecPolicy


def test_ngram_proposes_what_followed_the_latest_earlier_occurrence():
    index = NgramIndex(min_n=1, max_n=3)
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # [1, 2, 3] last ended before 7 (not before 9): the latest earlier match wins.
    assert index.propose(tokens, 3) == [7, 8, 1]
    assert index.propose([*tokens, 7], 2) == [8, 1]  # incremental: the index grows
    assert NgramIndex(1, 3).propose([5, 6, 7], 4) == []  # nothing earlier to copy
    assert NgramIndex(2, 3).propose([4, 5, 6, 5], 4) == []  # n below min_n never matches


def test_the_longest_n_is_tried_first():
    index = NgramIndex(min_n=1, max_n=2)
    # The 1-gram [2] last occurred before 5, the 2-gram [1, 2] before 3.
    assert index.propose([1, 2, 3, 4, 2, 5, 1, 2], 2) == [3, 4]


def _observe(policy: SpecPolicy, per_token_s: float) -> None:
    for _ in range(40):
        for tokens in (1, 5, 9, 64):
            policy.observe_step(tokens, 0.030 + per_token_s * tokens)


def test_a_well_accepted_sequence_gets_the_whole_cap_at_batch_one():
    policy = SpecPolicy(uses_draft_model=False)
    _observe(policy, 0.001)
    for _ in range(10):
        policy.record("a", 8, 8)
    assert policy.choose({"a": 8}, other_tokens=1) == {"a": 8}
    assert policy.choose({"a": 3}, other_tokens=1) == {"a": 3}  # never past the cap


def test_a_failing_sequence_stops_and_is_probed_ever_less_often():
    policy = SpecPolicy(uses_draft_model=True)
    _observe(policy, 0.001)
    policy.observe_draft(1, 0.010)
    for _ in range(10):
        policy.record("a", 4, 0)
    ks = [policy.choose({"a": 8}, other_tokens=1)["a"] for _ in range(PROBE_EVERY)]
    assert ks == [0] * (PROBE_EVERY - 1) + [1]  # one probe token after PROBE_EVERY steps
    policy.record("a", 1, 0)  # the probe failed: the next one waits twice as long
    ks = [policy.choose({"a": 8}, other_tokens=1)["a"] for _ in range(2 * PROBE_EVERY)]
    assert ks == [0] * (2 * PROBE_EVERY - 1) + [1]


def test_new_sequences_start_from_the_methods_recent_acceptance():
    policy = SpecPolicy(uses_draft_model=True)
    _observe(policy, 0.001)
    policy.observe_draft(1, 0.010)
    for i in range(30):
        policy.record(f"old{i}", 4, 0)
    assert policy.choose({"new": 8}, other_tokens=1) == {"new": 0}


def test_a_big_batch_stops_speculation_when_tokens_cost_real_time():
    cheap, dear = SpecPolicy(False), SpecPolicy(False)
    _observe(cheap, 0.0005)
    _observe(dear, 0.010)  # compute-bound: each token costs a third of a step
    for policy in (cheap, dear):
        for rid in "abcdefgh":
            for _ in range(5):
                policy.record(rid, 4, 2)
    caps = dict.fromkeys("abcdefgh", 8)
    assert sum(cheap.choose(caps, other_tokens=8).values()) > 8
    assert sum(dear.choose(caps, other_tokens=8).values()) == 0


def test_seeded_requests_get_k_from_their_acceptance_alone():
    fast, slow = SpecPolicy(False), SpecPolicy(False)
    _observe(fast, 0.0001)
    _observe(slow, 0.050)
    for policy in (fast, slow):
        for _ in range(5):
            policy.record("s", 4, 3)
    seeded = frozenset({"s"})
    assert fast.choose({"s": 8}, 1, seeded) == slow.choose({"s": 8}, 1, seeded)

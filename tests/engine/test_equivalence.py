"""A request's greedy output does not depend on how the engine scheduled it."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.engine.conftest import GREEDY_32
from tests.engine.prompts import PROMPTS

pytestmark = pytest.mark.slow  # each prompt runs alone first


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Each prompt's greedy continuation, run on its own."""
    return [llm.generate(p, GREEDY_32)[0].token_ids for p in PROMPTS]


def test_alone_equals_inside_a_mixed_batch_of_16(llm, alone):
    batch = PROMPTS[:16]
    assert len({len(llm.tokenizer.encode(p)) for p in batch}) > 8  # mixed lengths
    outputs = llm.generate(batch, GREEDY_32)
    assert [o.token_ids for o in outputs] == alone[:16]


def test_chunked_prefill_on_and_off(make_llm, alone):
    for chunked in (True, False):
        llm = make_llm(chunked_prefill=chunked, max_num_batched_tokens=24, max_num_seqs=16)
        outputs = llm.generate(PROMPTS, GREEDY_32)
        assert [o.token_ids for o in outputs] == alone


def test_long_prompt_is_split_across_steps(make_llm):
    llm = make_llm(chunked_prefill=True, max_num_batched_tokens=24, max_num_seqs=16)
    llm.add_request(PROMPTS[-1] * 3, SamplingParams(max_tokens=2, temperature=0.0))
    steps = 0
    outputs = []
    while llm.has_unfinished():
        outputs += llm.step()
        steps += 1
    # A long prompt under a 24-token budget: chunks, then its first token with the
    # last chunk, then one decode step.
    m = outputs[-1].metrics
    assert m.num_prefill_chunks == steps - 1 >= 3
    assert m.num_prefill_steps_waited == 0 and m.num_preemptions == 0
    assert 0 < m.prefill_time <= m.ttft and m.decode_time > 0


def test_prefix_caching_on_and_off(make_llm, alone):
    no_cache = make_llm(prefix_caching=False)
    assert [o.token_ids for o in no_cache.generate(PROMPTS, GREEDY_32)] == alone
    # An emptied cache: the first request has nothing cached, the repeat hits.
    cached = make_llm()
    assert cached.reset_prefix_cache()
    hits_before = cached.engine.get_stats().prefix_cache_hits
    first = cached.generate(PROMPTS[-1], GREEDY_32)[0]
    again = cached.generate(PROMPTS[-1], GREEDY_32)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens >= 16
    stats = cached.engine.get_stats()
    assert stats.prefix_cache_hits - hits_before == again.num_cached_tokens
    assert stats.num_running == stats.num_waiting == 0
    assert first.token_ids == again.token_ids == alone[-1]


def test_shared_long_prefix_reuses_blocks_and_keeps_output(make_llm):
    llm = make_llm()
    assert llm.reset_prefix_cache()
    reference = make_llm(prefix_caching=False)
    shared = "You are a careful assistant. " * 40
    prompts = [shared + "Question: what is 2 + 2?", shared + "Question: name a planet."]
    first, second = (llm.generate(p, GREEDY_32)[0] for p in prompts)
    assert second.num_cached_tokens >= 15 * 16
    expected = [o.token_ids for o in reference.generate(prompts, GREEDY_32)]
    assert [first.token_ids, second.token_ids] == expected


def test_preemption_by_recompute_keeps_outputs(make_llm, alone):
    # 24 blocks of 16 tokens cannot hold 16 requests of ~45 tokens (3 blocks) each.
    llm = make_llm(num_kv_blocks=24, max_model_len=256)
    # The engine is the session's (tests/engine/test_async_scheduling.py runs it too).
    before = llm.engine.scheduler.num_preemptions
    outputs = llm.generate(PROMPTS[:16], GREEDY_32)
    num_preemptions = llm.engine.scheduler.num_preemptions - before
    assert num_preemptions > 0
    assert [o.token_ids for o in outputs] == alone[:16]
    # Each request says what preemption cost it.
    preempted = [o.metrics for o in outputs if o.metrics.num_preemptions]
    assert sum(m.num_preemptions for m in preempted) == num_preemptions
    assert all(m.num_preempted_tokens > 0 for m in preempted)
    assert llm.engine.block_manager.num_free_blocks == 24


def test_cache_salt_shares_blocks_only_within_a_salt(make_llm):
    llm = make_llm()
    assert llm.reset_prefix_cache()

    def cached_tokens(salt: str | None) -> int:
        rid = llm.add_request(PROMPTS[-1], GREEDY_32, cache_salt=salt)
        while llm.has_unfinished():
            for out in llm.step():
                if out.request_id == rid and out.finished:
                    finished = out
        return finished.num_cached_tokens

    assert cached_tokens("tenant-a") == 0
    assert cached_tokens("tenant-b") == 0  # the same prompt under another salt
    assert cached_tokens(None) == 0  # unsalted requests share only with each other
    assert cached_tokens("tenant-a") >= 16
    assert cached_tokens(None) >= 16

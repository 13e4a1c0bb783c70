"""Block accounting: aborts return every block; a random workload keeps the books straight."""

from __future__ import annotations

import random

import torch

from engine import SamplingParams
from engine.kv_cache import BlockManager, allocate_kv_cache
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from tests.engine.prompts import PROMPTS


def _check_books(bm: BlockManager, live: list[Sequence]) -> None:
    refs = [0] * bm.num_blocks
    for seq in live:
        assert len(set(seq.block_table)) == len(seq.block_table)
        for block_id in seq.block_table:
            refs[block_id] += 1
    assert [b.ref_count for b in bm.blocks] == refs
    assert set(bm.free) == {i for i, r in enumerate(refs) if r == 0}
    for block_hash, block_id in bm.cached.items():
        assert bm.blocks[block_id].block_hash == block_hash


def test_random_adds_aborts_and_finishes_keep_accounting(llm):
    rng = random.Random(7)
    bm = BlockManager(num_blocks=48, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=32, enable_chunked_prefill=True)
    live: list[Sequence] = []
    shared = [rng.randrange(100) for _ in range(12)]  # a common prefix, for cache hits
    for step in range(600):
        if rng.random() < 0.3 and len(live) < 20:
            prompt = (shared if rng.random() < 0.5 else []) + [
                rng.randrange(100) for _ in range(rng.randint(1, 40))
            ]
            seq = llm.engine.make_sequence(prompt, SamplingParams(max_tokens=rng.randint(1, 30)))
            sched.add(seq)
            live.append(seq)
        if live and rng.random() < 0.1:
            victim = rng.choice(live)
            sched.finish(victim, "abort")
            live.remove(victim)
        for item in sched.schedule():
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            bm.cache_full_blocks(seq)
            if item.samples:
                seq.token_ids.append(rng.randrange(100))
                if seq.num_output_tokens >= seq.params.max_tokens:
                    sched.finish(seq, "length")
                    live.remove(seq)
        _check_books(bm, live)
        if step > 500 and not live:
            break
    for seq in list(live):
        sched.finish(seq, "abort")
    assert bm.num_free_blocks == bm.num_blocks
    assert sched.num_preemptions > 0
    assert sched.prefix_cache_hits > 0


def test_abort_returns_every_block_at_once(llm):
    engine = llm.engine
    free_before = engine.block_manager.num_free_blocks
    ids = [engine.add_request(p, SamplingParams(max_tokens=50)) for p in PROMPTS[:6]]
    for _ in range(4):
        engine.step()
    assert engine.block_manager.num_free_blocks < free_before
    for rid in ids:
        out = engine.abort(rid)
        assert out is not None and out.finished and out.finish_reason == "abort"
    assert engine.block_manager.num_free_blocks == free_before
    assert not engine.has_unfinished()
    assert engine.abort(ids[0]) is None


def test_a_small_cache_starts_finite_even_on_reused_memory():
    # Attention reads whole blocks, unwritten slots too (masked, but NaN * 0 is NaN).
    shape = (2, 2, 4, 16, 3, 64)
    for _ in range(3):
        del_me = torch.full(shape, float("nan"))
        del del_me
        caches = allocate_kv_cache(2, 4, 16, 3, 64, torch.float32, torch.device("cpu"))
        assert all(torch.isfinite(c).all() for c in caches)


def test_reset_prefix_cache_only_when_no_request_holds_blocks(llm):
    engine = llm.engine
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    llm.generate(PROMPTS[-1], greedy)  # its full blocks are cached now
    engine.add_request(PROMPTS[0], greedy)
    engine.step()
    assert not engine.reset_prefix_cache()  # a running request holds blocks
    while engine.has_unfinished():
        engine.step()
    assert engine.reset_prefix_cache()
    assert llm.generate(PROMPTS[-1], greedy)[0].num_cached_tokens == 0
    assert llm.generate(PROMPTS[-1], greedy)[0].num_cached_tokens >= 16

"""Block accounting: aborts return every block; a random workload keeps the books straight."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch

from engine import LLM, SamplingParams
from engine.kv_cache import BlockManager, allocate_kv_cache, chain_hash, root_hash
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
    sched = Scheduler(
        bm,
        max_num_seqs=8,
        max_num_batched_tokens=32,
        enable_chunked_prefill=True,
        eos_token_ids=(),
        max_model_len=1024,
    )
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
        scheduled = sched.schedule()
        new_tokens = [[rng.randrange(100)] for item in scheduled if item.samples]
        for seq, _ in sched.update(scheduled, new_tokens):
            if seq.finished:
                assert seq.finish_reason == "length"
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
    # ignore_eos: the session's engine samples on from wherever earlier tests left its
    # generator, and a request that met EOS within the four steps would not be running.
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in PROMPTS[:6]]
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


def _computed(
    bm: BlockManager, llm: LLM, token_ids: list[int], salt: str | None = None
) -> Sequence:
    """A sequence whose prompt is all in the cache, its full blocks named for reuse."""
    seq = llm.engine.make_sequence(token_ids, SamplingParams(max_tokens=1), cache_salt=salt)
    assert bm.allocate(seq, len(token_ids))
    seq.num_computed_tokens = len(token_ids)
    bm.cache_full_blocks(seq)
    return seq


def _hits(bm: BlockManager, llm: LLM, token_ids: list[int], salt: str | None = None) -> int:
    seq = llm.engine.make_sequence(token_ids, SamplingParams(max_tokens=1), cache_salt=salt)
    return len(bm.find_cached_prefix(seq)[0])


def test_equal_blocks_under_different_parents_never_share(llm):
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = _computed(bm, llm, [1, 2, 3, 4, 9, 9, 9, 9, 7])
    b = _computed(bm, llm, [5, 6, 7, 8, 9, 9, 9, 9, 7])
    # The second blocks hold the same tokens, but a block's KV depends on its whole prefix.
    assert a.block_hashes[1] != b.block_hashes[1]
    assert not set(a.block_table) & set(b.block_table)
    assert _hits(bm, llm, [5, 6, 7, 8, 9, 9, 9, 9, 7]) == 2
    assert _hits(bm, llm, [0, 6, 7, 8, 9, 9, 9, 9, 7]) == 0


def test_equal_prompts_share_blocks_only_under_one_salt(llm):
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    _computed(bm, llm, prompt, salt="tenant-a")
    assert _hits(bm, llm, prompt, salt="tenant-a") == 2
    assert _hits(bm, llm, prompt, salt="tenant-b") == 0
    assert _hits(bm, llm, prompt, salt="") == 0
    assert _hits(bm, llm, prompt) == 0
    _computed(bm, llm, prompt)  # unsalted: its own chain
    assert _hits(bm, llm, prompt) == 2
    assert _hits(bm, llm, prompt, salt="tenant-b") == 0


def test_block_hashes_do_not_depend_on_the_python_hash_seed():
    # Python's own hash of a str (the salt's) changes with PYTHONHASHSEED; a block's
    # name must be the same in every process.
    code = (
        "from engine.kv_cache import chain_hash, root_hash\n"
        "print(chain_hash(root_hash('tenant-a'), [7] * 16).hex())"
    )
    root = Path(__file__).resolve().parents[2]
    seen: set[str] = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        seen.add(out.stdout.strip())
    assert seen == {chain_hash(root_hash("tenant-a"), [7] * 16).hex()}

"""Async scheduling (engine/async_step.py) changes when the engine schedules, never what
it outputs: with async_scheduling on, every output (token ids, text, finish and stop
reason, usage) equals the synchronous engine's under the same config, for each stop
condition and each scheduling mode, against the bundled model."""

from __future__ import annotations

import asyncio
import logging

import pytest

from engine import LLM, AsyncLLM, EngineConfig, RequestOutput, SamplingParams
from engine.llm_engine import sync_only_because
from tests.conftest import TEST_KV_CACHE_BYTES
from tests.engine.conftest import GREEDY_32
from tests.engine.prompts import CAPITAL_QUESTION, PROMPTS
from tests.waiting import until_async

pytestmark = pytest.mark.slow  # each case runs twice, synchronously and ahead

CHATS = [
    CAPITAL_QUESTION,
    "Name one primary colour. Answer with one word.",
    "What is 2 + 2? Answer with a number.",
    "Say hello in French.",
]


def usage_and_output(out: RequestOutput) -> tuple[object, ...]:
    """What a client sees of a finished request: its output and its usage."""
    return (
        out.token_ids,
        out.text,
        out.finish_reason,
        out.stop_reason,
        len(out.prompt_token_ids),
        len(out.token_ids),
        out.num_cached_tokens,
    )


def both(make_llm, **config: object) -> tuple[LLM, LLM]:
    """The synchronous engine and the async one of a config, their prefix caches empty."""
    engines = make_llm(**config), make_llm(async_scheduling=True, **config)
    assert engines[1].engine.async_steps is not None
    for llm in engines:
        assert llm.reset_prefix_cache()
    return engines


def assert_same(make_llm, prompts, params, **config: object) -> list[RequestOutput]:
    """Runs the prompts on both engines; their outputs are equal; the async engine's."""
    sync, ahead = both(make_llm, **config)
    expected = [usage_and_output(o) for o in sync.generate(prompts, params)]
    outputs = ahead.generate(prompts, params)
    assert [usage_and_output(o) for o in outputs] == expected
    assert ahead.engine.block_manager.num_free_blocks == ahead.engine.block_manager.num_blocks
    assert not ahead.has_unfinished()
    return outputs


def test_greedy_batch_ending_at_every_max_tokens(make_llm):
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        for n in (1, 2, 3, 5, 8, 13, 21, 32, 1, 4, 7, 16, 32, 2, 9, 30)
    ]
    outputs = assert_same(make_llm, PROMPTS[:16], params)
    assert [len(o.token_ids) for o in outputs] == [p.max_tokens for p in params]
    assert {o.finish_reason for o in outputs} == {"length"}


def test_seeded_sampling_beside_greedy(make_llm):
    params = [
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=40, seed=i)
        if i % 3
        else SamplingParams(max_tokens=24, temperature=0.0)
        for i in range(12)
    ]
    assert_same(make_llm, PROMPTS[:12], params)


def test_eos_and_stop_strings(make_llm):
    sync = make_llm()
    prompts = [sync.tokenizer.apply_chat_template([{"role": "user", "content": c}]) for c in CHATS]
    eos = SamplingParams(max_tokens=64, temperature=0.0)
    outputs = assert_same(make_llm, prompts + PROMPTS[:4], eos)
    assert any(o.finish_reason == "stop" and o.stop_reason is None for o in outputs)
    stops = SamplingParams(max_tokens=48, temperature=0.0, stop=["\n", ".", " the"])
    outputs = assert_same(make_llm, prompts + PROMPTS[:8], stops)
    assert sum(o.stop_reason is not None for o in outputs) >= 4


def test_chunked_prefill(make_llm):
    config = {"max_num_batched_tokens": 24, "max_num_seqs": 16}
    prompts = [*PROMPTS[:12], PROMPTS[-1] * 3]
    assert_same(make_llm, prompts, GREEDY_32, **config)
    no_chunks = {**config, "chunked_prefill": False}
    assert_same(make_llm, prompts, GREEDY_32, **no_chunks)


def test_preemption_by_recompute(make_llm):
    # 24 blocks of 16 tokens cannot hold 16 requests of ~45 tokens (3 blocks) each. The
    # requests that a stop string ends free their blocks while their next step runs, and
    # waiting ones take them at once.
    config = {"num_kv_blocks": 24, "max_model_len": 256}
    params = [
        SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, stop=["\n"] * (i % 2))
        for i in range(16)
    ]
    outputs = assert_same(make_llm, PROMPTS[:16], params, **config)
    ahead = make_llm(async_scheduling=True, **config)
    assert ahead.engine.scheduler.num_preemptions > 0
    assert any(o.stop_reason == "\n" for o in outputs)


def test_prefix_cache_hits_are_the_same(make_llm):
    sync, ahead = both(make_llm)
    shared = "You are a careful assistant. " * 20
    questions = ["what is 2 + 2?", "name a planet.", "what colour is the sky?"]
    prompts = [shared + "Question: " + q for q in questions]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    seen = []
    for llm in (sync, ahead):
        outs = [llm.generate(p, params)[0] for p in prompts]  # one after another
        outs += llm.generate(prompts, params)  # all at once, each a full hit
        # A second turn: the first's prompt and answer, then more. Its hit reaches into
        # the blocks the first turn's output filled.
        more = llm.tokenizer.encode(" And then?")
        outs += llm.generate([o.prompt_token_ids + o.token_ids + more for o in outs[:3]], params)
        seen.append([usage_and_output(o) for o in outs])
    assert seen[0] == seen[1]
    cached = [usage[-1] for usage in seen[1]]
    assert cached[1] > 0 and min(cached[3:6]) > 0 and min(cached[6:]) > max(cached[3:6])


def test_abort_between_steps(make_llm):
    """An abort while the request's next step runs: its dropped token is not seen, its
    blocks are named as synchronously (a later request hits the same prefix)."""
    config = {"max_num_batched_tokens": 24, "max_num_seqs": 16}
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    long_prompt = PROMPTS[-1] * 3
    seen = []
    for llm in both(make_llm, **config):
        ids = [llm.add_request(p, params) for p in [*PROMPTS[:5], long_prompt]]
        streamed: dict[str, list[int]] = {rid: [] for rid in ids}
        finished: dict[str, object] = {}
        for step in range(6):
            if step == 4:  # one request decoding, one still in its prefill
                assert streamed[ids[1]] and not streamed[ids[5]]
                for rid in (ids[1], ids[5]):
                    aborted = llm.engine.abort(rid)
                    llm.processor.forget(rid)
                    assert aborted is not None and aborted.new_token_ids == []
                    finished[rid] = aborted.finish_reason
            for out in llm.step():
                streamed[out.request_id] += out.delta_token_ids
        while llm.has_unfinished():
            for out in llm.step():
                streamed[out.request_id] += out.delta_token_ids
                if out.finished:
                    finished[out.request_id] = usage_and_output(out)
        again = llm.generate(long_prompt, params)[0]
        seen.append(([streamed[r] for r in ids], [finished[r] for r in ids], again))
        free = llm.engine.block_manager
        assert free.num_free_blocks == free.num_blocks
    (sync_streams, sync_ends, sync_again), (streams, ends, again) = seen
    assert streams == sync_streams and ends == sync_ends
    assert usage_and_output(again) == usage_and_output(sync_again)
    assert len(streams[1]) < 32 and ends[1] == "abort"


def test_a_dropped_token_is_not_counted(make_llm):
    sync, ahead = both(make_llm)
    params = SamplingParams(max_tokens=64, temperature=0.0, stop=["."])
    counts = []
    for llm in (sync, ahead):
        before = llm.engine.get_stats().generation_tokens
        out = llm.generate(PROMPTS[0], params)[0]
        counts.append((len(out.token_ids), llm.engine.get_stats().generation_tokens - before))
    assert counts[0] == counts[1]


def test_steps_launched_on_the_core_thread_as_on_cuda(make_llm):
    """CUDA's way (engine/async_step.py): no worker, each step launched on the core
    thread and its tokens read back later, the same on a CPU but for the overlap."""
    config = {"max_num_seqs": 12}  # an engine of its own: its worker is taken away
    sync, ahead = both(make_llm, **config)
    steps = ahead.engine.async_steps
    assert steps is not None and steps.worker is not None
    steps.worker.shutdown()
    steps.worker = None
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=3, stop=["."])
    expected = [usage_and_output(o) for o in sync.generate(PROMPTS[:12], params)]
    assert [usage_and_output(o) for o in ahead.generate(PROMPTS[:12], params)] == expected


def test_speculation_and_a_kv_store_keep_it_off(make_llm, caplog):
    with caplog.at_level(logging.INFO, logger="semgate.engine"):
        spec = make_llm(spec_method="ngram", num_spec_tokens=3, async_scheduling=True)
    assert spec.engine.async_steps is None
    assert "async scheduling is off: speculative decoding (ngram)" in caplog.text
    store = EngineConfig(kv_store="redis://localhost:6379/0", async_scheduling=True)
    assert "KV store" in (sync_only_because(store) or "")


def test_streams_through_the_engine_core(llm):
    """AsyncLLM with async scheduling: streams with stop strings equal the synchronous
    engine's, a stream left early aborts its request, and the blocks all come back."""
    engine = AsyncLLM(EngineConfig(async_scheduling=True, kv_cache_memory=TEST_KV_CACHE_BYTES))
    params = SamplingParams(max_tokens=40, temperature=0.0, stop=["\n\n", "."])

    async def collect(prompt: str) -> tuple[str, list[int], str | None]:
        text, tokens, reason = "", [], None
        async for out in engine.generate(prompt, params):
            text += out.delta_text
            tokens += out.delta_token_ids
            reason = out.finish_reason
        return text, tokens, reason

    async def leave_early() -> int:
        async for out in engine.generate(PROMPTS[1], SamplingParams(max_tokens=200)):
            if len(out.token_ids) >= 3:
                break
        return len(out.token_ids)

    async def main() -> tuple[int, list[tuple[str, list[int], str | None]]]:
        left, *streams = await asyncio.gather(leave_early(), *map(collect, PROMPTS[:4]))
        await until_async("the blocks are free", lambda: engine.get_stats().kv_cache_usage == 0)
        return left, streams

    try:
        left, streams = asyncio.run(main())
    finally:
        engine.shutdown()
    expected = [(o.text, o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS[:4], params)]
    assert streams == expected and left == 3
    assert any(reason == "stop" for _, _, reason in streams)

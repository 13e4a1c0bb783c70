"""AsyncLLM: streams of deltas from the engine core process, abort, and the core's life."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from engine import AsyncLLM, EngineConfig, SamplingParams
from engine.step_window import StepWindow
from tests.engine.conftest import StepClock
from tests.engine.prompts import PROMPTS
from tests.waiting import until_async

pytestmark = pytest.mark.slow  # engine core processes: the module's, and one per test that ends one


@pytest.fixture(scope="module")
def async_llm():
    engine = AsyncLLM()
    yield engine
    engine.shutdown()


async def _collect(async_llm: AsyncLLM, prompt: str, params: SamplingParams) -> tuple[str, list]:
    text, outs = "", []
    async for out in async_llm.generate(prompt, params):
        text += out.delta_text
        outs.append(out)
    return text, outs


def test_concurrent_streams_match_offline_outputs(async_llm, llm):
    params = SamplingParams(max_tokens=32, temperature=0.0, stop=["\n\n"])

    async def main():
        return await asyncio.gather(*(_collect(async_llm, p, params) for p in PROMPTS[:6]))

    results = asyncio.run(main())
    offline = llm.generate(PROMPTS[:6], params)
    for (text, outs), ref in zip(results, offline, strict=True):
        assert text == ref.text
        assert [t for o in outs for t in o.delta_token_ids] == ref.token_ids
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert outs[-1].finish_reason == ref.finish_reason


def test_leaving_a_stream_early_aborts_and_frees_blocks(async_llm):
    params = SamplingParams(max_tokens=200, ignore_eos=True)  # no early stop: it must abort

    async def main():
        async for out in async_llm.generate(PROMPTS[1], params):
            if len(out.token_ids) >= 3:
                assert async_llm.get_stats().kv_cache_usage > 0
                break
        # The core frees them before its next step, then reports.
        await until_async("the blocks are free", lambda: async_llm.get_stats().kv_cache_usage == 0)

    asyncio.run(main())
    stats = async_llm.get_stats()
    assert stats.kv_cache_usage == 0
    assert stats.num_running == stats.num_waiting == 0


def test_abort_ends_the_stream_with_finish_reason_abort(async_llm):
    async def main():
        outs = []
        async for out in async_llm.generate(
            PROMPTS[2], SamplingParams(max_tokens=200, ignore_eos=True), request_id="to-abort"
        ):
            outs.append(out)
            if len(outs) == 2:
                async_llm.abort("to-abort")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert len(outs[-1].token_ids) < 200


def test_bad_request_raises_in_the_caller(async_llm):
    async def main():
        async for _ in async_llm.generate("", SamplingParams()):
            pass

    with pytest.raises(ValueError, match="prompt is empty"):
        asyncio.run(main())


def test_a_request_over_the_context_length_is_refused_before_it_is_sent(async_llm):
    async def main():
        prompt = [1] * async_llm.max_model_len
        async for _ in async_llm.generate(prompt, SamplingParams(max_tokens=1)):
            pass

    with pytest.raises(ValueError, match="context length"):
        asyncio.run(main())


def test_outputs_carry_the_whole_request_so_far_and_its_timings(async_llm):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def main():
        return [out async for out in async_llm.generate(PROMPTS[3], params)]

    outs = asyncio.run(main())
    last = outs[-1]
    assert last.prompt_token_ids == async_llm.tokenizer.encode(PROMPTS[3])
    assert last.token_ids == [t for o in outs for t in o.delta_token_ids]
    assert last.text == "".join(o.delta_text for o in outs)
    m = last.metrics
    assert len(m.token_times) == 8 and m.ttft > 0 and m.e2e >= m.ttft
    assert m.queue_time is not None and m.queue_time >= 0
    # The phases, from the engine core: queued, prefill (one chunk), decode.
    assert m.num_prefill_chunks == 1 and m.num_prefill_steps_waited == 0
    assert m.arrival_time <= m.first_scheduled_time <= m.token_times[0]  # one clock
    assert m.prefill_time == m.token_times[0] - m.first_scheduled_time > 0
    assert m.decode_time == m.token_times[-1] - m.token_times[0] > 0


def test_a_load_failure_is_raised_by_the_constructor():
    with pytest.raises(ValueError, match="cannot hold one request"):
        AsyncLLM(EngineConfig(num_kv_blocks=1, max_model_len=2048))


def test_a_dead_engine_process_fails_the_streams_and_later_requests():
    engine = AsyncLLM(EngineConfig(num_threads=1))
    params = SamplingParams(max_tokens=500, ignore_eos=True)

    async def main():
        async for out in engine.generate(PROMPTS[0], params):
            if len(out.token_ids) >= 2:
                os.kill(engine._process.pid, signal.SIGKILL)

    try:
        with pytest.raises(RuntimeError, match="engine process exited"):
            asyncio.run(main())
        with pytest.raises(RuntimeError, match="engine process exited"):
            asyncio.run(main())
    finally:
        engine.shutdown()


def test_shutdown_stops_the_engine_process():
    engine = AsyncLLM(EngineConfig(num_threads=1))
    asyncio.run(_collect(engine, PROMPTS[0], SamplingParams(max_tokens=2)))
    engine.shutdown()
    assert engine._process.poll() == 0
    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(_collect(engine, PROMPTS[0], SamplingParams(max_tokens=2)))


def test_step_time_counts_each_step_and_ages_out_while_idle(async_llm, step_clock: StepClock):
    async_llm._steps = StepWindow(seconds=1.0)  # a short window, to see it age out
    params = SamplingParams(max_tokens=5, ignore_eos=True)

    async def main():
        return [out async for out in async_llm.generate(PROMPTS[2], params)]

    asyncio.run(main())
    steps = async_llm.get_stats().steps
    assert steps.prefill_steps >= 1 and steps.prefill_tokens > 0
    assert (steps.decode_steps, steps.decode_tokens) == (4, 4)
    step_clock.now += 1.1  # the idle core reports nothing: the window ages on the reader's side
    idle = async_llm.get_stats().steps
    assert (idle.prefill_steps, idle.decode_steps, idle.busy_fraction) == (0, 0, 0.0)

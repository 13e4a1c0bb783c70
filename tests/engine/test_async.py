"""AsyncLLM: streams of deltas from the background engine thread, and abort."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from engine import AsyncLLM, EngineConfig, SamplingParams
from tests.engine.prompts import PROMPTS


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
    bm = async_llm.engine.block_manager
    free_before = bm.num_free_blocks

    async def main():
        async for out in async_llm.generate(PROMPTS[1], SamplingParams(max_tokens=200)):
            if len(out.token_ids) >= 3:
                break
        for _ in range(200):  # the engine thread frees them before its next step
            if bm.num_free_blocks == free_before:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert bm.num_free_blocks == free_before
    assert not async_llm.engine.has_unfinished()


def test_bad_request_raises_in_the_caller(async_llm):
    async def main():
        async for _ in async_llm.generate("", SamplingParams()):
            pass

    with pytest.raises(ValueError, match="prompt is empty"):
        asyncio.run(main())


def test_the_step_loop_keeps_its_thread_count_when_another_thread_sets_one():
    """Torch re-applies the last count set anywhere at a thread's first parallel op: an
    embedder worker setting 1 used to leave a 2-thread engine on one thread."""
    engine = AsyncLLM(EngineConfig(num_threads=2, device="cpu"))
    counts: list[int] = []
    step = engine.engine.step

    def counting_step():
        counts.append(torch.get_num_threads())
        return step()

    engine.engine.step = counting_step
    other = threading.Thread(target=torch.set_num_threads, args=(1,))
    other.start()
    other.join()
    try:
        asyncio.run(_collect(engine, PROMPTS[0], SamplingParams(max_tokens=2)))
    finally:
        engine.shutdown()
        torch.set_num_threads(EngineConfig().num_threads)
    assert counts and set(counts) == {2}

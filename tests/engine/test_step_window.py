"""The last minute's step time, prefill against decode (engine/step_window.py)."""

from __future__ import annotations

import math
import uuid

import pytest

from engine import SamplingParams
from engine.step_window import StepTime, StepWindow
from tests.engine.conftest import StepClock


def test_sums_split_prefill_and_decode_steps():
    window = StepWindow()
    window.add(StepTime(0.5, prefill_tokens=100, decode_tokens=3))  # decodes ride along
    window.add(StepTime(0.125, prefill_tokens=0, decode_tokens=4))
    window.add(StepTime(0.25, prefill_tokens=0, decode_tokens=6))
    s = window.stats()
    assert (s.prefill_steps, s.prefill_seconds, s.prefill_tokens) == (1, 0.5, 100)
    assert (s.decode_steps, s.decode_seconds, s.decode_tokens) == (2, 0.375, 10)
    assert 0 < s.window_seconds <= 60
    assert s.busy_fraction == 1.0  # 0.875 s of steps inside a window a few us old


def test_steps_leave_the_window_when_it_has_passed(step_clock: StepClock):
    window = StepWindow(seconds=0.2)
    window.add(StepTime(0.01, prefill_tokens=8, decode_tokens=0))
    step_clock.now += 0.25
    window.add(StepTime(0.02, prefill_tokens=0, decode_tokens=1))
    s = window.stats()
    assert (s.prefill_steps, s.prefill_seconds, s.prefill_tokens) == (0, 0.0, 0)
    assert (s.decode_steps, s.decode_tokens) == (1, 1)
    assert s.window_seconds == pytest.approx(0.2)
    step_clock.now += 0.25
    empty = window.stats()
    assert (empty.decode_steps, empty.decode_seconds, empty.busy_fraction) == (0, 0.0, 0.0)


def test_engine_counts_each_prompt_chunk_and_each_decode(make_llm):
    llm = make_llm(chunked_prefill=True, max_num_batched_tokens=24, max_num_seqs=16)
    llm.engine.step_window = StepWindow()  # only this test's steps
    prompt = f"Request {uuid.uuid4()}: tell me about the sea, the sky and the mountains."
    num_prompt = len(llm.tokenizer.encode(prompt))  # unique text: no prefix-cache hit
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    [out] = llm.generate([prompt], params)
    assert len(out.token_ids) == 6
    s = llm.engine.get_stats().steps
    assert (s.prefill_steps, s.prefill_tokens) == (math.ceil(num_prompt / 24), num_prompt)
    # The last chunk's step samples the first token; each later token is one decode step.
    assert (s.decode_steps, s.decode_tokens) == (5, 5)
    assert s.prefill_seconds > 0 and s.decode_seconds > 0

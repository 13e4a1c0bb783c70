"""Bad input gets a clear error, and the engine keeps serving afterwards."""

from __future__ import annotations

import pytest

from engine import EngineConfig, SamplingParams
from tests.engine.prompts import PROMPTS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 1e9}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["x"] * 100}, "stop"),
    ],
)
def test_absurd_sampling_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_unknown_model_is_rejected():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        EngineConfig(model="no-such-model")


def test_a_budget_smaller_than_the_batch_is_rejected():
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= max_num_seqs"):
        EngineConfig(max_num_batched_tokens=8, max_num_seqs=16)


def test_bad_prompts_are_rejected_and_the_engine_keeps_serving(llm):
    params = SamplingParams(max_tokens=8, temperature=0.0)
    max_len = llm.engine.max_model_len
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate("", params)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]], params)
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([[1, 2, 10**9]], params)
    with pytest.raises(ValueError, match="context length"):
        llm.generate([[1] * max_len], params)
    with pytest.raises(ValueError, match="context length"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=max_len))
    # A bad prompt in a batch leaves nothing half-submitted.
    with pytest.raises(ValueError):
        llm.generate([PROMPTS[0], ""], params)
    assert not llm.engine.has_unfinished()
    out = llm.generate(PROMPTS[0], params)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8


def test_duplicate_request_id_is_rejected(llm):
    engine = llm.engine
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=2), request_id="dup")
    with pytest.raises(ValueError, match="already running"):
        engine.add_request(PROMPTS[1], SamplingParams(max_tokens=2), request_id="dup")
    engine.abort("dup")
    assert not engine.has_unfinished()

"""The quality benchmark's teacher-forced scoring against the engine's own runner."""

from __future__ import annotations

import torch

from bench.quality_bench import answer_logprobs
from tests.engine.conftest import first_step_logits


def test_answer_logprobs_match_the_runner_prefix_by_prefix(make_llm):
    llm = make_llm(quantization=None)
    tok = llm.tokenizer
    prompt = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    )
    answer = tok.encode("The capital of France is Paris.")
    ours = answer_logprobs(llm, prompt, answer)
    ids = prompt + answer
    expected = torch.stack(
        [
            torch.log_softmax(first_step_logits(llm.engine, ids[:n]), dim=-1)[ids[n]]
            for n in range(len(prompt), len(ids))
        ]
    ).cpu()
    assert ours.shape == (len(answer),)
    assert torch.allclose(ours, expected, atol=1e-3, rtol=0), (ours - expected).abs().max()
    assert (ours <= 0).all()

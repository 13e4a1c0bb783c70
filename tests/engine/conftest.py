"""Engine fixtures: engine variants and the Hugging Face reference, each built once."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.config import resolve_model_path
from engine.llm_engine import LLMEngine
from engine.scheduler import ScheduledSequence

# Greedy, EOS ignored: what the engine tests generate per prompt. The scheduling-
# invariance tests run each prompt alone first, one decode step per token.
GREEDY_32 = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="session")
def hf_reference():
    """transformers' own GGUF loader (dequantised to float32): the reference model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def float32_llm(make_llm):
    """The engine with float32 weights, as the reference runs them (the CPU default is int4)."""
    return make_llm(quantization=None)


def first_step_logits(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """Our engine's next-token logits after a whole prompt, through the real runner."""
    seq = engine.make_sequence(token_ids, SamplingParams(max_tokens=1))
    assert engine.block_manager.allocate(seq, len(token_ids))
    try:
        logits = engine.runner.compute_logits([ScheduledSequence(seq, len(token_ids))])
    finally:
        engine.block_manager.free_sequence(seq)
    assert logits is not None
    return logits[0]

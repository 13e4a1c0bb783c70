"""The engine benches' requests: greedy, every side generating exactly as many tokens."""

from __future__ import annotations

from engine.llm import LLM
from engine.sampling_params import SamplingParams


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy with EOS ignored: every side generates exactly max_tokens."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def warm_up(llm: LLM) -> None:
    llm.generate("Warm-up.", greedy(4))

"""Sampling: seeds, top-k/top-p sets, stop strings, max_tokens and EOS."""

from __future__ import annotations

import torch

from engine import SamplingParams
from engine.sampler import apply_top_k_top_p
from tests.engine.conftest import first_step_logits
from tests.engine.prompts import CAPITAL_QUESTION, PROMPTS


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm):
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    alone = llm.generate(PROMPTS[0], params)[0].token_ids
    others = [SamplingParams(max_tokens=24, temperature=1.0, seed=i) for i in range(5)]
    others += [SamplingParams(max_tokens=30, temperature=0.7)] * 3
    batch = llm.generate([PROMPTS[0], *PROMPTS[1:9]], [params, *others])
    assert batch[0].token_ids == alone
    assert llm.generate(PROMPTS[0], params)[0].token_ids == alone


def test_different_seeds_give_different_samples(llm):
    outs = llm.generate(
        [PROMPTS[8]] * 4, [SamplingParams(max_tokens=24, temperature=1.0, seed=s) for s in range(4)]
    )
    assert len({tuple(o.token_ids) for o in outs}) > 1


def _allowed(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> set[int]:
    """The reference nucleus: top-k by logit, then the smallest prefix reaching top_p."""
    probs = (logits / temperature).softmax(-1)
    order = probs.argsort(descending=True)
    if top_k:
        order = order[:top_k]
    if top_p >= 1.0:
        return set(order.tolist())
    kept = probs[order] / probs[order].sum()
    cutoff = int((kept.cumsum(0) < top_p).sum()) + 1
    return set(order[:cutoff].tolist())


def test_top_k_and_top_p_never_leave_the_allowed_set(llm):
    prompt = PROMPTS[3]
    logits = first_step_logits(llm.engine, llm.tokenizer.encode(prompt))
    for top_k, top_p in ((5, 1.0), (0, 0.6), (20, 0.8)):
        allowed = _allowed(logits, 1.0, top_k, top_p)
        params = [
            SamplingParams(max_tokens=1, temperature=1.0, top_k=top_k, top_p=top_p, seed=s)
            for s in range(60)
        ]
        drawn = {o.token_ids[0] for o in llm.generate([prompt] * 60, params)}
        assert drawn <= allowed, (top_k, top_p)
        assert len(drawn) > 1


def test_top_k_top_p_mask_matches_reference():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 300, generator=gen) * 3
    ks, ps = [0, 7, 50, 0], [0.5, 1.0, 0.9, 1.0]
    masked = apply_top_k_top_p(logits, ks, ps)
    for row in range(4):
        kept = set(torch.nonzero(masked[row] > float("-inf")).flatten().tolist())
        assert kept == _allowed(logits[row], 1.0, ks[row], ps[row])


def test_stop_string_ends_the_request_and_is_not_in_the_text(llm):
    greedy = llm.generate(PROMPTS[18], SamplingParams(max_tokens=48, temperature=0.0))[0]
    words = greedy.text.split()
    stop = words[len(words) // 2]
    out = llm.generate(PROMPTS[18], SamplingParams(max_tokens=48, temperature=0.0, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.stop_reason == stop
    assert out.text == greedy.text[: greedy.text.index(stop)]
    assert stop not in out.text


def test_max_tokens_ends_with_length(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))[
        0
    ]
    assert len(out.token_ids) == 5
    assert out.finish_reason == "length"


def test_eos_ends_with_stop(llm):
    params = SamplingParams(max_tokens=64, temperature=0.0)
    out = llm.chat([{"role": "user", "content": CAPITAL_QUESTION}], params)[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] in llm.tokenizer.eos_token_ids
    assert "Paris" in out.text

"""Speculative decoding is lossless: greedy output is unchanged token for token, and
sampled output keeps the target's distribution."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.input_batch import BatchRow
from engine.llm_engine import LLMEngine
from engine.sampler import sampling_probs
from engine.speculative.verifier import verify_sampled
from tests.engine.prompts import PROMPTS

# Prompts whose continuations repeat or quote their own text, so proposals are made
# and (mostly, not always) accepted.
GROUNDED = [
    "Copy the list exactly.\nList: apple, banana, cherry, grape, lemon, mango, orange, "
    "peach, pear, plum.\nCopy: apple, banana, cherry,",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):",
    "<|im_start|>user\nRewrite in capitals: the quick brown fox jumps over the lazy dog. "
    "The quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
    "one two three four five six seven eight nine ten one two three four five six seven",
]
MIXED = GROUNDED + PROMPTS[:4] + [PROMPTS[-1] * 4]  # the last one needs chunked prefill
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)

SPEC_CONFIGS = {
    "ngram-k2": {"spec_method": "ngram", "num_spec_tokens": 2},
    "ngram-k5": {"spec_method": "ngram", "num_spec_tokens": 5, "spec_ngram_min": 1},
    "self-draft-k3": {"spec_method": "draft", "num_spec_tokens": 3, "spec_draft_layers": 10},
    # A separate draft model: the target's own file, loaded again with its own KV
    # cache. Its drafts equal the target's argmax only if that cache is kept in step.
    "draft-model-k4": {
        "spec_method": "draft",
        "num_spec_tokens": 4,
        "spec_draft_model": "smollm2-135m-instruct",
    },
}


@pytest.fixture(scope="module")
def reference(llm) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(MIXED, GREEDY)]


@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_greedy_is_token_for_token_identical(make_llm, reference, name):
    spec = make_llm(**SPEC_CONFIGS[name])
    alone = [spec.generate(p, GREEDY)[0].token_ids for p in GROUNDED[:2]]
    assert alone == reference[:2]
    before = spec.engine.get_stats().spec_draft_tokens
    # A draft as big as the target is slow on CPU: it gets the short prompts only.
    prompts = GROUNDED if "draft-model" in name else MIXED
    batch = spec.generate(prompts, GREEDY)
    assert [o.token_ids for o in batch] == reference[: len(prompts)]
    stats = spec.engine.get_stats()
    assert stats.spec_draft_tokens > before  # it did speculate in the mixed batch
    assert 0 < stats.spec_accepted_tokens <= stats.spec_draft_tokens
    # Each request's own counts add up to the engine's.
    assert sum(o.metrics.spec_draft_tokens for o in batch) == stats.spec_draft_tokens - before
    assert sum(o.metrics.spec_accepted_tokens for o in batch) <= stats.spec_accepted_tokens
    assert stats.spec_mean_accepted_length > 1.0
    assert stats.num_running == stats.num_waiting == 0
    assert spec.engine.block_manager.usage == 0.0  # every block came back


def test_a_separate_draft_keeps_its_cache_in_step(make_llm):
    spec = make_llm(**SPEC_CONFIGS["draft-model-k4"])
    spec.generate(GROUNDED, GREEDY)
    # Same weights as the target: near-total acceptance, which stale KV would break.
    assert spec.engine.get_stats().spec_acceptance_rate > 0.9


def test_opted_out_and_sampled_requests_share_the_batch(make_llm, reference):
    spec = make_llm(**SPEC_CONFIGS["ngram-k5"])
    sampled = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    opted_out = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, speculate=False)
    params = [GREEDY, sampled, opted_out, GREEDY, sampled, opted_out]
    outputs = spec.generate(GROUNDED + GROUNDED[:2], params)
    for out, p, ref in zip(outputs, params, reference[:4] + reference[:2], strict=True):
        if p.greedy:
            assert out.token_ids == ref
        assert len(out.token_ids) == 32
    # Opted-out requests alone propose nothing.
    before = spec.engine.get_stats().spec_draft_tokens
    alone = spec.generate(GROUNDED, opted_out)
    assert [o.token_ids for o in alone] == reference[:4]
    assert spec.engine.get_stats().spec_draft_tokens == before


def test_preemption_with_speculation_keeps_output(make_llm, reference):
    # 24 blocks of 16 tokens cannot hold the whole batch: requests are preempted.
    spec = make_llm(spec_method="ngram", num_spec_tokens=4, num_kv_blocks=24, max_model_len=384)
    outputs = spec.generate(MIXED, GREEDY)
    assert [o.token_ids for o in outputs] == reference
    assert spec.engine.get_stats().num_preemptions > 0


def test_max_tokens_never_overshoots(make_llm, llm):
    spec = make_llm(**SPEC_CONFIGS["draft-model-k4"])
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in range(1, 13)]
    prompts = [GROUNDED[3]] * len(params)
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    outputs = spec.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert [len(o.token_ids) for o in outputs] == list(range(1, 13))
    assert all(o.finish_reason == "length" for o in outputs)


def test_stop_string_inside_an_accepted_run(make_llm, llm):
    spec = make_llm(**SPEC_CONFIGS["draft-model-k4"])
    full = llm.generate(GROUNDED[3], GREEDY)[0].text
    stop = full.split()[5]  # a word a few tokens in, inside a run the draft gets right
    params = SamplingParams(max_tokens=32, temperature=0.0, stop=[stop])
    want = llm.generate(GROUNDED[3], params)[0]
    got = spec.generate(GROUNDED[3], params)[0]
    assert (got.text, got.token_ids, got.finish_reason) == (
        want.text,
        want.token_ids,
        "stop",
    )
    assert got.stop_reason == stop


def test_eos_inside_an_accepted_run(make_llm, llm):
    spec = make_llm(**SPEC_CONFIGS["draft-model-k4"])
    params = SamplingParams(max_tokens=200, temperature=0.0)
    prompt = [{"role": "user", "content": "Say hello."}]
    want = llm.chat(prompt, params)[0]
    got = spec.chat(prompt, params)[0]
    assert want.finish_reason == "stop" and len(want.token_ids) < 200  # ended by EOS
    assert got.token_ids == want.token_ids
    assert got.finish_reason == "stop"


# -- the verifier keeps the target's distribution -----------------------------

TOP_K = SamplingParams(temperature=1.0, top_k=20)
DRAWS = 6000
CHI2_19_P001 = 43.82  # chi-square, 19 degrees of freedom (the top-20 support), p = 0.001


def _prompt_logits(engine: LLMEngine, prompt: str, num_layers: int | None) -> torch.Tensor:
    """Next-token logits after prompt from the first num_layers layers (all when None)."""
    seq = engine.make_sequence(prompt, SamplingParams(max_tokens=1))
    runner = engine.runner
    assert engine.block_manager.allocate(seq, seq.num_tokens)
    try:
        step = runner.inputs.build([BatchRow(seq.token_ids, 0, seq.block_table, 1)])
        hidden = engine.model(
            step.input_ids,
            step.positions,
            runner.attention,
            runner.kv_caches,
            step.attn_meta,
            num_layers,
        )
        return engine.model.compute_logits(hidden[step.logit_rows])[0]
    finally:
        engine.block_manager.free_sequence(seq)


@pytest.fixture(scope="module")
def target_and_draft(llm) -> tuple[torch.Tensor, torch.Tensor]:
    """The real model's logits (p) and its 10-layer self-draft's probabilities (q),
    over the union of both top-100s: the same shapes at a size that samples fast."""
    target = _prompt_logits(llm.engine, PROMPTS[8], None)
    draft = _prompt_logits(llm.engine, PROMPTS[8], 10)
    vocab = torch.cat([target.topk(100).indices, draft.topk(100).indices]).unique()
    q = sampling_probs(draft[vocab][None], [TOP_K])[0]
    return target[vocab], q


def _counts(p_logits: torch.Tensor, q: torch.Tensor | None, naive: bool) -> torch.Tensor:
    """First-token counts over DRAWS verifications of one draft drawn from q (or, when
    q is None, the point-mass draft an n-gram lookup makes: here the argmax)."""
    gen = torch.Generator().manual_seed(0)
    p = sampling_probs(p_logits[None], [TOP_K])[0]
    logits = torch.stack([p_logits, p_logits])
    counts = torch.zeros_like(p)
    for _ in range(DRAWS):
        draft = int(p.argmax()) if q is None else int(torch.multinomial(q, 1, generator=gen))
        if naive:
            # The verifier's acceptance, but a rejection redraws from p itself rather
            # than from the residual max(p - q, 0): the bug this test must catch.
            q_draft = 1.0 if q is None else float(q[draft])
            accept = float(torch.rand(1, generator=gen)) * q_draft < float(p[draft])
            token = draft if accept else int(torch.multinomial(p, 1, generator=gen))
        else:
            draft_probs = None if q is None else q[None]
            token = verify_sampled(logits, [draft], draft_probs, TOP_K, [gen, gen])[0]
        counts[token] += 1
    return counts


def _chi_square(counts: torch.Tensor, p_logits: torch.Tensor) -> float:
    p = sampling_probs(p_logits[None], [TOP_K])[0]
    assert counts[p == 0].sum() == 0  # nothing outside the target's top-k
    expected = p[p > 0] * counts.sum()
    return float(((counts[p > 0] - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("draft", ["draft model", "point mass"])
def test_rejection_sampling_reproduces_the_target_distribution(target_and_draft, draft):
    p_logits, q = target_and_draft
    q = q if draft == "draft model" else None
    assert _chi_square(_counts(p_logits, q, naive=False), p_logits) < CHI2_19_P001
    # The same test rejects a verifier without the residual resampling step.
    assert _chi_square(_counts(p_logits, q, naive=True), p_logits) > CHI2_19_P001


def test_seeded_requests_with_spec_keep_their_length_and_tokens(make_llm):
    spec = make_llm(**SPEC_CONFIGS["ngram-k5"])
    params = SamplingParams(max_tokens=30, temperature=1.0, top_k=5, seed=3, ignore_eos=True)
    first = spec.generate(GROUNDED, params)
    again = spec.generate(GROUNDED, params)
    assert [len(o.token_ids) for o in first] == [30] * len(GROUNDED)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]  # seeds hold
    # ...whatever else runs: other requests' acceptance and the step times that
    # steer their k never reach a seeded request's k or randomness.
    alone = spec.generate(GROUNDED[0], params)[0]
    assert alone.token_ids == first[0].token_ids

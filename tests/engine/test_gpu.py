"""The engine on an NVIDIA GPU (pytest -m gpu; scripts/gpu-check runs them there).
Without CUDA every test here skips. They run on a random-weight model of SmolLM2's
shape built from SmolLM2's tokenizer files (bench/gpu_models.py), found in
$SEMGATE_GPU_TOKENIZER or gpu-tok/ (`python -m bench.gpu_check --export-tokenizer`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.gpu_models import PROMPTS, fa4_against_reference, random_model
from engine import LLM, EngineConfig, EngineStats, SamplingParams
from engine.flash_attention import flash_kernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
needs_fa4 = pytest.mark.skipif(flash_kernel() is None, reason="needs flash-attn-4 ([gpu] extra)")

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    tokenizer = Path(os.environ.get("SEMGATE_GPU_TOKENIZER", "gpu-tok"))
    if not (tokenizer / "tokenizer.json").is_file():
        pytest.skip(
            f"no tokenizer files in {tokenizer} (python -m bench.gpu_check --export-tokenizer)"
        )
    return random_model(tokenizer)


@contextlib.contextmanager
def _engine(model_dir: Path, **overrides: object) -> Iterator[LLM]:
    """An engine that gives its GPU memory back when the block ends."""
    llm = LLM(EngineConfig(model=str(model_dir), kv_cache_memory=2 << 30, **overrides))
    try:
        yield llm
    finally:
        del llm
        torch.cuda.empty_cache()


@needs_fa4
def test_fa4_matches_the_reference_on_paged_layouts():
    """Partial last pages, grouped-query heads, a prefill chunk beside decodes and
    verification rows, NaN in the pages nobody uses: bf16 within 1e-2 of the
    reference computed in float32."""
    assert fa4_against_reference() <= 1e-2


@needs_fa4
def test_the_flash_backend_serves_bfloat16_by_default(model_dir):
    with _engine(model_dir) as llm:
        assert llm.engine.config.dtype == "bfloat16"
        assert llm.engine.runner.attention.name == "flash"
        assert llm.engine.block_size == 128
        assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.graphs


def _padded_run(
    model_dir: Path,
    params: SamplingParams | list[SamplingParams],
    *,
    replay: bool,
    **overrides: object,
) -> tuple[list[list[int]], EngineStats, set[int]]:
    """A generation by a fresh engine whose steps run padded to their buckets, replaying
    its captured graphs or with them dropped (the same steps, eagerly): its tokens, its
    stats and the query lengths it captured graphs for. Fresh each time, so that a
    second run meets no prefix cache nor speculation state of the first (either would
    change its steps)."""
    # 8 sequences at most, as many as the prompts: 4 batch buckets to capture.
    with _engine(model_dir, enforce_eager=False, max_num_seqs=8, **overrides) as llm:
        graphs = llm.engine.runner.graphs
        assert graphs is not None and graphs.graphs
        captured = {query_len for _, query_len in graphs.graphs}
        if not replay:
            graphs.graphs.clear()
        tokens = [o.token_ids for o in llm.generate(PROMPTS, params)]
        return tokens, llm.engine.get_stats(), captured


@needs_fa4
def test_graph_replays_equal_the_same_steps_run_eagerly(model_dir):
    """Captured graphs against the very same padded steps run eagerly, token for token,
    a batch whose size shrinks as its requests finish."""
    params = [
        SamplingParams(max_tokens=8 + 6 * i, temperature=0.0, ignore_eos=True) for i in range(8)
    ]
    replayed, _, captured = _padded_run(model_dir, params, replay=True)
    eager, _, _ = _padded_run(model_dir, params, replay=False)
    assert captured == {1}
    assert replayed == eager


@needs_fa4
def test_graph_replays_of_verification_rows_equal_eager_ones(model_dir):
    """Speculative decoding's verification rows (query length > 1) through captured
    graphs against the same padded steps run eagerly. The self-draft proposes whatever a
    random model's text holds (an n-gram drafter may find nothing), and a seed keeps how
    many it proposes from depending on the steps' times."""
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, seed=0)
    # Two proposals at most: query lengths 1-3, few kernels for flash-attn-4 to compile.
    spec = {"spec_method": "draft", "num_spec_tokens": 2}
    replayed, stats, captured = _padded_run(model_dir, params, replay=True, **spec)
    eager, _, _ = _padded_run(model_dir, params, replay=False, **spec)
    assert captured == {1, 2, 3}
    assert stats.spec_draft_tokens > 0
    assert replayed == eager


@needs_fa4
def test_async_scheduling_equals_sync_with_graphs(model_dir):
    """Async scheduling on CUDA (each step launched before the last one's tokens reach
    the host; placeholders read on the device): the synchronous engine's tokens, greedy
    and seeded, in a batch that shrinks as its requests finish."""
    params = [
        SamplingParams(max_tokens=4 + 5 * i, temperature=0.0 if i % 2 else 0.8, seed=i)
        for i in range(8)
    ]
    outputs = []
    for ahead in (False, True):
        with _engine(model_dir, async_scheduling=ahead) as llm:
            assert (llm.engine.async_steps is not None) == ahead
            outputs.append([o.token_ids for o in llm.generate(PROMPTS, params)])
    assert outputs[0] == outputs[1]


@needs_fa4
def test_the_engine_on_flash_begins_as_on_its_reference(model_dir):
    """The engine's own path to the kernel (its paged layout, page table and metadata
    buffers), not only the kernel: bf16, eager, the same first tokens as the engine on
    the plain-torch reference on most prompts (near-ties of a random model may differ)."""
    first = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    runs = []
    for backend in ("flash", "flash_reference"):
        with _engine(model_dir, attention_backend=backend, enforce_eager=True) as llm:
            runs.append([o.token_ids for o in llm.generate(PROMPTS, first)])
    assert sum(a[0] == b[0] for a, b in zip(*runs, strict=True)) >= 7


def test_float32_greedy_matches_transformers(model_dir):
    from transformers import LlamaForCausalLM

    with _engine(model_dir, dtype="float32") as llm:
        outs = llm.generate(PROMPTS, GREEDY)
    hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        for out in outs:
            ids = torch.tensor([out.prompt_token_ids], device="cuda")
            ref = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
            assert ref[0, ids.shape[1] :].tolist() == out.token_ids


def test_bfloat16_outputs_begin_as_float32_ones(model_dir):
    """bf16 rounding changes a random model's near-ties within a few tokens: its first
    tokens agree with float32 on most prompts."""
    first = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with _engine(model_dir, dtype="float32") as llm:
        wide = [o.token_ids for o in llm.generate(PROMPTS, first)]
    with _engine(model_dir) as llm:
        narrow = [o.token_ids for o in llm.generate(PROMPTS, first)]
    assert sum(a[0] == b[0] for a, b in zip(wide, narrow, strict=True)) >= 6

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
from engine import LLM, EngineConfig, SamplingParams
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


@needs_fa4
def test_graph_replays_equal_the_same_steps_run_eagerly(model_dir):
    """Captured graphs against the very same padded steps run eagerly (the graphs
    dropped), token for token, a batch whose size shrinks as its requests finish."""
    params = [
        SamplingParams(max_tokens=8 + 6 * i, temperature=0.0, ignore_eos=True) for i in range(8)
    ]
    with _engine(model_dir, enforce_eager=False) as llm:
        graphed = [o.token_ids for o in llm.generate(PROMPTS, params)]
        llm.engine.runner.graphs.graphs.clear()
        eager = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert graphed == eager


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

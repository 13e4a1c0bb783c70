"""Engine fixtures: engine variants and the Hugging Face reference, each built once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from safetensors.torch import save_file

from engine import SamplingParams, step_window
from engine.config import resolve_model_path
from engine.cpu_kernels import cpu_kernels_or_none
from engine.disk_cache import cache_dir
from engine.llm_engine import LLMEngine
from engine.scheduler import ScheduledSequence

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Greedy, EOS ignored: what the engine tests generate per prompt. The scheduling-
# invariance tests run each prompt alone first, one decode step per token.
GREEDY_32 = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)

# Tests of semgate's own CPU kernels (engine/kernels), which skip where they cannot run.
needs_kernels = pytest.mark.skipif(
    cpu_kernels_or_none() is None, reason="semgate's CPU kernels need AVX-512 VNNI and a C compiler"
)


class StepClock:
    """engine/step_window.py's clock, moved on by hand: a window ages without a wait."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def step_clock(monkeypatch: pytest.MonkeyPatch) -> StepClock:
    clock = StepClock()
    monkeypatch.setattr(step_window, "time", clock)
    return clock


@pytest.fixture(scope="session")
def hf_reference():
    """transformers' own GGUF loader (dequantised to float32): the reference model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = hf_reference_dir()
    if where.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
        return model.eval(), tokenizer
    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    save_hf_directory(model, tokenizer, where)
    return model.eval(), tokenizer


def hf_reference_dir() -> Path:
    """Where transformers' GGUF load of the bundled model is kept as a Hugging Face
    directory: dequantising the GGUF takes transformers about 10 s, reading the saved
    safetensors about 1. Keyed by the GGUF file (path, size, mtime) and transformers'
    version, so the reference is still what transformers makes of that very file."""
    import transformers

    path = resolve_model_path("smollm2-135m-instruct")
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    return cache_dir() / "hf-reference" / hashlib.sha256(key.encode()).hexdigest()[:16]


def save_hf_directory(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, where: Path
) -> None:
    """config.json + model.safetensors + the tokenizer's files, written beside `where`
    and renamed onto it, so no reader sees half a directory."""
    where.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(dir=where.parent, suffix=".tmp"))
    try:
        # save_pretrained refuses models that came from GGUF, so write the files directly.
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (temp / "config.json").write_text(json.dumps(config))
        tied = config.get("tie_word_embeddings", False)
        state = {
            name: tensor.contiguous().clone()
            for name, tensor in model.state_dict().items()
            if not (tied and name == "lm_head.weight")
        }
        save_file(state, temp / "model.safetensors")
        tokenizer.save_pretrained(temp)
        os.replace(temp, where)
    except OSError:
        pass  # another session wrote it first, or the cache is read-only: reuse is lost
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def float32_llm(make_llm):
    """The engine in float32 throughout, weights and KV cache, as the reference runs it
    (the CPU default is int4 over a bfloat16 cache)."""
    return make_llm(quantization=None, kv_cache_dtype="float32")


def first_step_logits(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """Our engine's next-token logits after a whole prompt, through the real runner."""
    seq = engine.make_sequence(token_ids, SamplingParams(max_tokens=1))
    assert engine.block_manager.allocate(seq, len(token_ids))
    try:
        logits = engine.runner.compute_logits([ScheduledSequence.of(seq, len(token_ids))])
    finally:
        engine.block_manager.free_sequence(seq)
    assert logits is not None
    return logits[0]

"""What the GPU check runs on: random-weight Llama models of SmolLM2-135M's shape with
SmolLM2's tokenizer (so no weights travel to the GPU machine), and a paged attention
step to hold flash-attn-4 against its reference. Shared by scripts/gpu-check
(bench/gpu_check.py) and the GPU tests (tests/engine/test_gpu.py)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.flash_reference import flash_attn_varlen_reference

SHAPES = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
    ),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# What the GPU check and tests generate from: prose, code and a question, 8 in a batch.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three laws of thermodynamics are",
    "import numpy as np\nx = np.",
    "Q: What is 2+2?\nA:",
    "Translate to German: good morning",
    "The quick brown fox",
]


def export_tokenizer(out: Path) -> None:
    """SmolLM2's tokenizer as Hugging Face files (on the CPU machine, from the bundled
    GGUF): what the GPU machine builds its random-weight models with."""
    from engine.config import resolve_model_path
    from engine.loader import load_tokenizer

    tok = load_tokenizer(resolve_model_path("smollm2-135m-instruct"))
    out.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(out / "tokenizer.json"))
    config = {
        "chat_template": tok.chat_template,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))


def random_model(tokenizer_dir: Path, shape: str = "smollm2-135m") -> Path:
    """A Hugging Face directory of a random-weight Llama of `shape` (seed 0), built once
    per machine."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(tempfile.gettempdir()) / f"semgate-gpu-{shape}"
    if not (path / "config.json").is_file():
        # A dict: transformers 5 takes rope_theta through its legacy keywords (into
        # rope_parameters), which its signature does not name; 4.x names it.
        settings: dict[str, Any] = dict(
            vocab_size=49152,
            bos_token_id=1,
            eos_token_id=2,
            max_position_embeddings=8192,
            rope_theta=1e5,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            **SHAPES[shape],
        )
        config = LlamaConfig(**settings)
        torch.manual_seed(0)
        staging = Path(tempfile.mkdtemp(prefix=f"semgate-gpu-{shape}-"))
        LlamaForCausalLM(config).save_pretrained(staging, safe_serialization=True)
        for name in TOKENIZER_FILES:
            shutil.copy(tokenizer_dir / name, staging)
        os.replace(staging, path)
    return path


# q, k, v, cu_seqlens_q, seqused_k, page_table and max_seqlen_q.
PagedCase = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int
]


def paged_attention_case(
    device: torch.device, dtype: torch.dtype, page_size: int = 128
) -> PagedCase:
    """One step's q and a paged cache in flash-attn-4's layout: decodes whose last page
    is partly (or just) filled, a prefill chunk over earlier context, a whole prompt and
    verification rows, SmolLM2's heads (9 query, 3 KV, 64 dims), pages scattered; the
    pages no row uses hold NaN, as the kernel must never read them. Returns q, k, v,
    cu_seqlens_q, seqused_k, page_table, max_seqlen_q."""
    gen = torch.Generator().manual_seed(0)
    rows = [(1, 300), (1, page_size), (64, 700), (100, 100), (4, 257), (9, 1000), (1, 1)]
    num_pages = 64
    order = torch.randperm(num_pages, generator=gen).tolist()
    tables = [[order.pop() for _ in range(-(-keys // page_size))] for _, keys in rows]
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q_lens = torch.tensor([q for q, _ in rows])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).int()
    used = torch.tensor([k for _, k in rows], dtype=torch.int32)
    q = torch.randn(int(q_lens.sum()), 9, 64, generator=gen)
    k = torch.randn(num_pages, page_size, 3, 64, generator=gen)
    v = torch.randn(num_pages, page_size, 3, 64, generator=gen)
    unused = [p for p in range(num_pages) if p not in table.flatten().tolist()]
    k[unused], v[unused] = float("nan"), float("nan")
    q, k, v, cu, used, table = (
        t.to(device) for t in (q.to(dtype), k.to(dtype), v.to(dtype), cu, used, table)
    )
    return q, k, v, cu, used, table, int(q_lens.max())


def fa4_against_reference(dtype: torch.dtype = torch.bfloat16) -> float:
    """flash-attn-4's max |difference| from the reference (computed in float32 on the
    same bfloat16 inputs) on paged_attention_case."""
    from flash_attn.cute import flash_attn_varlen_func

    q, k, v, cu, used, table, max_q = paged_attention_case(torch.device("cuda"), dtype)
    kwargs: dict[str, Any] = dict(
        cu_seqlens_q=cu, max_seqlen_q=max_q, seqused_k=used, page_table=table, causal=True
    )
    out = flash_attn_varlen_func(q, k, v, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    ref, _ = flash_attn_varlen_reference(q.float(), k.float(), v.float(), **kwargs)
    return (out.float() - ref).abs().max().item()

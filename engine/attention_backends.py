"""Which attention backend a model runs on (EngineConfig.attention_backend)."""

from __future__ import annotations

import torch

from engine.attention import AttentionBackend, TorchAttention
from engine.cpu_attention import KV_CACHE_DTYPES, MAX_HEAD_DIM, CpuAttention
from engine.cpu_kernels import cpu_kernel

BACKENDS = ("auto", "cpu", "torch")


def select_attention_backend(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    kv_cache_dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """ "auto": semgate's CPU kernel wherever it runs (a float32 model on a CPU with
    AVX-512 VNNI, a float32 or bfloat16 KV cache (default: the model's dtype), a
    head_dim it takes), else TorchAttention (SDPA)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})")
    kernel = cpu_kernel("paged_attention", device, dtype)
    fits = (
        head_dim % 16 == 0
        and head_dim <= MAX_HEAD_DIM
        and (kv_cache_dtype or dtype) in KV_CACHE_DTYPES
    )
    if name == "cpu" and (kernel is None or not fits):
        raise ValueError(
            "attention backend 'cpu' needs a float32 model on a CPU with AVX-512 VNNI, a "
            "float32 or bfloat16 KV cache and a head_dim that is a multiple of 16 up to "
            f"{MAX_HEAD_DIM} (this one: {head_dim})"
        )
    if name in ("auto", "cpu") and kernel is not None and fits:
        return CpuAttention(kernel)
    return TorchAttention(device)

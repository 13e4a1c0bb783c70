"""Attention on CPU by semgate's own kernel (engine/kernels/paged_attention.c): it
reads keys and values where they lie in the paged cache, so no blocks are gathered,
no masks built and no queries padded, and it writes the step's new keys and values
into their slots in the same call. Keys are kept transposed within each block
([block][kv_head][dim][block_size]; the kernel's comment says why), so this
backend's cache is read and written by this backend only.

Each query token is attended on its own over exactly the keys it may see, so its
bits depend on nothing else in the step: batching, chunking and speculation leave
greedy output unchanged by construction (TorchAttention gets there by padding
SDPA's inputs to the shapes where its CPU kernel happens to be stable).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.attention import AttentionBatch

MAX_HEAD_DIM = 256  # the kernel keeps a head's vectors in 16 registers (MAX_DIM there)
# What the kernel's cache may hold: bfloat16 widens to float32 exactly on load.
KV_CACHE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass
class CpuAttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] each new token's KV slot
    block_tables: torch.Tensor  # [rows, width] contiguous
    token_row: torch.Tensor  # [tokens] each token's row of block_tables
    token_keys: torch.Tensor  # [tokens] keys each token sees: its position + 1


class CpuMetadataBuilder:
    def build(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        lens = batch.query_lens
        starts = np.repeat(batch.query_start[:-1], lens)
        # Token j of a row sits at position context_len - query_len + j.
        keys = np.repeat(batch.context_lens - lens, lens) + np.arange(len(starts)) - starts + 1
        return CpuAttentionMetadata(
            batch.slot_mapping,
            batch.block_tables.contiguous(),
            torch.from_numpy(np.repeat(np.arange(len(lens)), lens)),
            torch.from_numpy(keys.astype(np.int64)),
        )


class CpuAttention:
    name = "cpu"
    max_short_query = 0  # rows in any order
    # The kernel stores keys transposed within a block, 16 slots to a vector.
    block_size_multiple = 16

    def __init__(self, kernel: Callable[..., Any]) -> None:
        self.kernel = kernel

    def metadata_builder(self, max_num_seqs: int, max_num_keys: int) -> CpuMetadataBuilder:
        return CpuMetadataBuilder()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: CpuAttentionMetadata,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        if kv_cache.dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"the cpu attention backend keeps no {kv_cache.dtype} KV cache")
        q, k, v = (_heads_contiguous(t) for t in (q, k, v))
        if k.stride(0) != v.stride(0):
            k, v = k.contiguous(), v.contiguous()
        out = q.new_empty(num_tokens, num_heads * head_dim)
        failed = self.kernel(
            q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), k.stride(0),
            kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), kv_cache.dtype == torch.bfloat16,
            meta.slot_mapping.data_ptr(),
            meta.block_tables.data_ptr(), meta.block_tables.stride(0),
            meta.token_row.data_ptr(), meta.token_keys.data_ptr(),
            num_tokens, num_heads, k.shape[1], head_dim, kv_cache.shape[2],
            1 / math.sqrt(head_dim), out.data_ptr(),
        )  # fmt: skip
        if failed:
            raise MemoryError(f"paged attention: no scratch memory for {num_tokens} tokens")
        return out


def _heads_contiguous(t: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, dim] with heads and dims packed (any stride between tokens), as
    the kernel reads them: the step's q, k and v are views into one projection."""
    if t.stride(2) == 1 and t.stride(1) == t.shape[2]:
        return t
    return t.contiguous()

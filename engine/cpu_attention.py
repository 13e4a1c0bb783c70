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
from typing import Any, Self

import numpy as np
import torch
from torch import Tensor

from engine.attention import AttentionBackend, AttentionBatch, AttentionSpec, StepLimits
from engine.cpu_kernels import cpu_kernel
from engine.staged_buffer import StagedBuffer

MAX_HEAD_DIM = 256  # the kernel keeps a head's vectors in 16 registers (MAX_DIM there)
# What the kernel's cache may hold: bfloat16 widens to float32 exactly on load.
KV_CACHE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass
class CpuAttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] each new token's KV slot
    block_tables: torch.Tensor  # [rows, width], rows at any stride
    token_row: torch.Tensor  # [tokens] each token's row of block_tables
    token_keys: torch.Tensor  # [tokens] keys each token sees: its position + 1


class CpuMetadataBuilder:
    """The kernel's per-token rows and key counts, in buffers allocated once for the
    largest step; the kernel reads the block tables where the batch keeps them."""

    def __init__(self, limits: StepLimits) -> None:
        cpu = torch.device("cpu")
        self.token_row = StagedBuffer(limits.max_num_tokens, cpu)
        self.token_keys = StagedBuffer(limits.max_num_tokens, cpu)
        self.rows = np.arange(limits.max_num_seqs, dtype=np.int64)
        self.offsets = np.arange(limits.max_num_tokens, dtype=np.int64)

    def build(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        lens = batch.query_lens
        n, num_tokens = len(lens), int(batch.query_start[-1])
        row = self.token_row.np[:num_tokens]
        keys = self.token_keys.np[:num_tokens]
        if num_tokens == n:  # a token a row (decodes): it sees its row's whole context
            row[:] = self.rows[:n]
            keys[:] = batch.context_lens
        else:
            row[:] = np.repeat(self.rows[:n], lens)
            # Token j of a row sits at position context_len - query_len + j: it sees that
            # many keys plus its own, j being its flat index less its row's first.
            first = batch.context_lens - batch.query_start[:-1] - lens + 1
            np.add(first[row], self.offsets[:num_tokens], out=keys)
        return CpuAttentionMetadata(
            batch.slot_mapping,
            torch.from_numpy(batch.block_tables),
            self.token_row.copy(num_tokens),
            self.token_keys.copy(num_tokens),
        )


class CpuAttention(AttentionBackend):
    """Keys transposed within each block ([block][kv_head][dim][slot]), values as
    written ([block][slot][kv_head][dim]), in one [2, blocks, block_size, kv_heads, dim]
    tensor a layer: the bytes are the common layout's, their order the kernel's."""

    name = "cpu"
    kv_layout = "cpu: keys transposed within a block"
    max_short_query = 0  # rows in any order
    # The kernel stores keys transposed within a block, 16 slots to a vector.
    block_size_multiple = 16
    preferred_block_size = 16
    graphable = False  # no graphs on a CPU (the graph runner calls its step eagerly)

    def __init__(self, spec: AttentionSpec, kernel: Callable[..., Any]) -> None:
        super().__init__(spec)
        self.kernel = kernel

    @staticmethod
    def unsupported(spec: AttentionSpec) -> str | None:
        if cpu_kernel("paged_attention", spec.device, spec.dtype) is None:
            return "needs a float32 model on a CPU with AVX-512 VNNI (and a C compiler)"
        if spec.head_dim % 16 or spec.head_dim > MAX_HEAD_DIM:
            return f"needs a head_dim that is a multiple of 16 up to {MAX_HEAD_DIM}"
        if spec.kv_cache_dtype not in KV_CACHE_DTYPES:
            return "needs a float32 or bfloat16 KV cache"
        return None

    @classmethod
    def create(cls, spec: AttentionSpec) -> Self:
        kernel = cpu_kernel("paged_attention", spec.device, spec.dtype)
        assert kernel is not None
        return cls(spec, kernel)

    def metadata_builder(self, limits: StepLimits) -> CpuMetadataBuilder:
        return CpuMetadataBuilder(limits)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: CpuAttentionMetadata
    ) -> Tensor:
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

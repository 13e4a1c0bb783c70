"""Attention on NVIDIA GPUs by flash-attn-4 (`flash_attn.cute.flash_attn_varlen_func`)
straight over the paged cache: one call a layer serves the step's prefill chunks,
decodes and speculative verifications alike, with cu_seqlens_q splitting the flat
queries, seqused_k giving each sequence's keys and an int32 page table naming its
blocks, so nothing is gathered.

The metadata is the same tensors, shapes and host integers for every step of one
batch size (the page table is always max_blocks wide, max_seqlen_k always the
longest sequence), so a decode step can be captured as a CUDA graph
(engine/graph_runner.py). `flash_reference` is this backend with the plain-torch
reference of the kernel (engine/flash_reference.py): it runs on a CPU, for tests.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

from engine.attention import AttentionBackend, AttentionBatch, AttentionSpec, StepLimits
from engine.flash_reference import flash_attn_varlen_reference
from engine.staged_buffer import StagedBuffer

VarlenFunc = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class FlashAttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] each new token's KV slot
    cu_seqlens_q: torch.Tensor  # [rows + 1] int32
    seqused_k: torch.Tensor  # [rows] int32: keys of each row after the step
    page_table: torch.Tensor  # [rows, max_blocks] int32, padded with the null block
    # Host bounds: the longest query rounded up to a power of two (fewer kernel variants
    # to compile; any bound that covers the step is correct), and every row's keys.
    max_seqlen_q: int
    max_seqlen_k: int


class FlashMetadataBuilder:
    def __init__(self, device: torch.device, limits: StepLimits) -> None:
        self.max_blocks = limits.max_blocks
        self.null_block = limits.null_block
        self.max_seqlen_k = limits.max_blocks * limits.block_size
        n = limits.max_num_seqs
        self.cu_seqlens_q = StagedBuffer(n + 1, device, torch.int32)
        self.seqused_k = StagedBuffer(n, device, torch.int32)
        self.page_table = StagedBuffer(n * limits.max_blocks, device, torch.int32)

    def build(self, batch: AttentionBatch) -> FlashAttentionMetadata:
        n, width = batch.block_tables.shape
        self.cu_seqlens_q.np[: n + 1] = batch.query_start
        self.seqused_k.np[:n] = batch.context_lens
        size = n * self.max_blocks
        pages = self.page_table.np[:size].reshape(n, self.max_blocks)
        pages[:, :width] = batch.block_tables
        # Past a row's pages: never read, but graph replays need one fixed width.
        pages[:, width:] = self.null_block
        longest = int(batch.query_lens.max())
        return FlashAttentionMetadata(
            batch.slot_mapping,
            self.cu_seqlens_q.copy(n + 1),
            self.seqused_k.copy(n),
            self.page_table.copy(n, self.max_blocks),
            1 << (longest - 1).bit_length(),
            self.max_seqlen_k,
        )


@functools.cache
def flash_kernel() -> VarlenFunc | None:
    """flash-attn-4's varlen function, or None where it is not installed."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


class FlashAttention(AttentionBackend):
    name = "flash"
    max_short_query = 0  # cu_seqlens_q takes the rows in any order
    block_size_multiple = 16
    # Pages load by TMA only when a page is one key tile of the kernel (128 on Hopper);
    # other sizes take a slower path.
    preferred_block_size = 128
    graphable = True

    def __init__(self, spec: AttentionSpec, varlen: VarlenFunc) -> None:
        super().__init__(spec)
        self.varlen = varlen

    @staticmethod
    def unsupported(spec: AttentionSpec) -> str | None:
        if spec.device.type != "cuda":
            return "needs an NVIDIA GPU"
        # flash-attn-4 reads a paged KV cache on sm90 (Hopper) and sm100/sm110
        # (Blackwell) only: its sm80 and sm120 kernels assert page_table is None.
        if torch.cuda.get_device_capability(spec.device)[0] not in (9, 10, 11):
            return "needs a Hopper or Blackwell data-center GPU (compute capability 9.x-11.x)"
        if flash_kernel() is None:
            return "needs flash-attn-4 (pip install -e '.[gpu]')"
        if spec.dtype not in (torch.bfloat16, torch.float16):
            return "needs a bfloat16 or float16 model"
        if spec.kv_cache_dtype != spec.dtype:
            return "needs the KV cache in the model's dtype"
        if spec.head_dim % 8 or not 8 <= spec.head_dim <= 128:
            return "needs a head_dim that is a multiple of 8 from 8 to 128"
        return None

    @classmethod
    def create(cls, spec: AttentionSpec) -> Self:
        kernel = flash_kernel()
        assert kernel is not None
        return cls(spec, kernel)

    def metadata_builder(self, limits: StepLimits) -> FlashMetadataBuilder:
        return FlashMetadataBuilder(self.spec.device, limits)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: FlashAttentionMetadata
    ) -> Tensor:
        num_tokens, _, head_dim = q.shape
        k_cache, v_cache = self.write_kv(kv_cache, k, v, meta.slot_mapping)
        out, _ = self.varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.cu_seqlens_q,
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=meta.max_seqlen_k,
            seqused_k=meta.seqused_k,
            page_table=meta.page_table,
            softmax_scale=1 / math.sqrt(head_dim),
            causal=True,
        )
        return out.reshape(num_tokens, -1)


class FlashReferenceAttention(FlashAttention):
    """The flash backend over the plain-torch reference kernel: any device, any float
    dtype (a KV cache of another dtype is widened), and never picked by "auto"."""

    name = "flash_reference"

    @staticmethod
    def unsupported(spec: AttentionSpec) -> str | None:
        return None

    @classmethod
    def create(cls, spec: AttentionSpec) -> Self:
        return cls(spec, flash_attn_varlen_reference)

"""The attention-backend seam.

A backend receives, per layer, the step's new q/k/v for a flat batch of tokens
and that layer's paged KV cache ([2, num_blocks, block_size, kv_heads,
head_dim]); it writes the new k/v into their cache slots and returns the
attention output. Metadata is built once per step and shared by every layer.
A backend declares what it needs of a batch (its short queries first, a block size
multiple) and builds its metadata into persistent buffers; InputBatch orders the
rows, so TorchAttention treats the leading short queries (decodes, verifications)
as one padded batch.

TorchAttention computes every query row the same way whatever else is in the step,
so greedy output does not depend on batching, chunking or speculation even where
the linear layers round activations to bfloat16 (which turns a 1e-7 difference
into a different token now and then). SDPA's CPU kernel gives a row bit-identical
results when (measured on torch 2.13) its keys are padded to a multiple of 16
under an explicit mask, never sliced to the exact length or masked by is_causal,
and its sequence has at least 3 query rows (1 and 2 take other code paths):
keys run to whole blocks and short queries are padded to MIN_QUERY_ROWS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from engine.staged_buffer import StagedBuffer


@dataclass
class AttentionBatch:
    """The step as an attention backend sees it, rows in the backend's order. The
    arrays and tensors are views of persistent buffers, valid until the next build."""

    block_size: int
    query_lens: np.ndarray  # [n] each row's tokens this step
    context_lens: np.ndarray  # [n] tokens in its cache after the step (earlier + query)
    query_start: np.ndarray  # [n + 1] each row's first flat token, then the total
    table_lens: np.ndarray  # [n] blocks in its table
    block_tables: torch.Tensor  # [n, max table_lens] on the device, padded with block 0
    slot_mapping: torch.Tensor  # [tokens] on the device: each token's KV slot


class AttentionMetadataBuilder(Protocol):
    def build(self, batch: AttentionBatch) -> Any: ...


class AttentionBackend(Protocol):
    name: str
    # What the backend needs of the batch: its queries of at most max_short_query tokens
    # first (0: rows in any order), and a block size that is a multiple of
    # block_size_multiple. InputBatch orders the rows and checks the block size.
    max_short_query: int
    block_size_multiple: int

    def metadata_builder(self, max_num_seqs: int, max_num_keys: int) -> AttentionMetadataBuilder:
        """A builder of this backend's metadata into its own persistent buffers, for steps
        of up to max_num_seqs sequences of up to max_num_keys keys each."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: Any,
    ) -> torch.Tensor: ...


@dataclass
class _Chunk:
    start: int
    end: int
    block_ids: torch.Tensor
    mask: torch.Tensor  # [query, keys of its whole blocks]


# Queries up to this long join the padded batch; longer ones (prefill chunks) are
# attended one sequence at a time, where padding would waste more than it saves.
MAX_SHORT_QUERY = 16
# Short queries are padded to at least this many rows (see the module docstring).
MIN_QUERY_ROWS = 3
# Key padding (measured on torch 2.13's CPU kernel, 3 and 9 query rows): a row whose
# context is at most ~195 keys gets the same bits at every padded width up to 2048; a
# longer one gets other bits at widths whose last 512-key split (the kernel's kv split
# size) is partly filled, but the same at every multiple of 512. So keys past
# SMALL_KEYS are padded to a multiple of 512: a row's bits then depend neither on the
# widest sequence of its batch nor on blocks held for a sequence's proposals.
SMALL_KEYS = 192
KV_SPLIT = 512


@dataclass
class _ShortBatch:
    """The leading short queries (decodes, verifications), padded to max_query rows."""

    num_tokens: int  # their rows in the flat batch
    block_tables: torch.Tensor  # [n, max_blocks]
    max_query: int
    mask: torch.Tensor  # [n, 1, max_query, keys of the widest block table]
    # The flat row of each padded query slot (pads repeat a real row), and the padded
    # slot of each flat row, to pad and unpad.
    pad_index: torch.Tensor
    unpad_index: torch.Tensor


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor
    short: _ShortBatch | None
    chunks: list[_Chunk]


class TorchAttention:
    """SDPA over the paged cache: gathers each sequence's blocks, runs anywhere."""

    name = "torch"
    max_short_query = MAX_SHORT_QUERY
    # Keys run to whole blocks, and a row's bits hold only with keys padded to a
    # multiple of 16 (see the module docstring).
    block_size_multiple = 16

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def metadata_builder(self, max_num_seqs: int, max_num_keys: int) -> TorchMetadataBuilder:
        return TorchMetadataBuilder(self.device, max_num_seqs, max_num_keys)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: TorchAttentionMetadata,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        kv_heads = k_cache.shape[-2]
        # A cache of another dtype (kv_cache_dtype) stores rounded keys and values;
        # attention runs in the model's dtype on them, widened back.
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
        short = meta.short
        if not meta.chunks:  # only short queries: nothing to assemble
            assert short is not None
            return self._short(q, k_cache, v_cache, short).reshape(num_tokens, -1)
        out = q.new_empty(q.shape)
        if short is not None:
            out[: short.num_tokens] = self._short(q[: short.num_tokens], k_cache, v_cache, short)
        for c in meta.chunks:
            keys = _gather(k_cache, c.block_ids, q.dtype).transpose(0, 1)
            values = _gather(v_cache, c.block_ids, q.dtype).transpose(0, 1)
            out[c.start : c.end] = F.scaled_dot_product_attention(
                q[c.start : c.end].transpose(0, 1).unsqueeze(0),
                keys.unsqueeze(0),
                values.unsqueeze(0),
                attn_mask=c.mask,
                enable_gqa=True,
            )[0].transpose(0, 1)
        return out.view(num_tokens, num_heads * head_dim)

    @staticmethod
    def _short(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, short: _ShortBatch
    ) -> torch.Tensor:
        """The short queries as one padded batch: [their tokens, heads, head_dim]."""
        keys = _gather(k_cache, short.block_tables, q.dtype).transpose(1, 2)
        values = _gather(v_cache, short.block_tables, q.dtype).transpose(1, 2)
        n, heads, dim = short.block_tables.shape[0], q.shape[1], q.shape[2]
        padded = q.index_select(0, short.pad_index).view(n, short.max_query, heads, dim)
        out = F.scaled_dot_product_attention(
            padded.transpose(1, 2), keys, values, attn_mask=short.mask, enable_gqa=True
        )
        out = out.transpose(1, 2).reshape(n * short.max_query, heads, dim)
        return out.index_select(0, short.unpad_index)


class TorchMetadataBuilder:
    """TorchAttention's metadata; its index tensors live in persistent buffers, while
    the masks, whose widths follow the step's longest context, are made per step."""

    def __init__(self, device: torch.device, max_num_seqs: int, max_num_keys: int) -> None:
        # Every short query padded to MAX_SHORT_QUERY (>= MIN_QUERY_ROWS) rows at most.
        size = max_num_seqs * MAX_SHORT_QUERY
        self.q_pos = StagedBuffer(size, device)
        self.pad_index = StagedBuffer(size, device)
        self.unpad_index = StagedBuffer(size, device)
        self.arange = np.arange(MAX_SHORT_QUERY, dtype=np.int64)
        # Each key's position, padding included (see key_width).
        self.key_pos = torch.arange(key_width(max_num_keys, KV_SPLIT), device=device)

    def _key_pos(self, num_keys: int) -> torch.Tensor:
        """Positions 0..num_keys - 1 (grown once for a block size that does not divide
        KV_SPLIT, whose padded widths run further)."""
        if num_keys > len(self.key_pos):
            self.key_pos = torch.arange(num_keys, device=self.key_pos.device)
        return self.key_pos[:num_keys]

    def build(self, batch: AttentionBatch) -> TorchAttentionMetadata:
        # InputBatch put the short queries first (max_short_query).
        num_short = int(np.count_nonzero(batch.query_lens <= MAX_SHORT_QUERY))
        short = self._short_batch(batch, num_short) if num_short else None
        chunks: list[_Chunk] = []
        for i in range(num_short, len(batch.query_lens)):
            start, end = int(batch.query_start[i]), int(batch.query_start[i + 1])
            context, num_blocks = int(batch.context_lens[i]), int(batch.table_lens[i])
            tables = _padded(batch.block_tables[i : i + 1, :num_blocks], batch.block_size)
            # Query j sits at position past + j and sees keys 0..past + j.
            q_pos = self.key_pos[context - (end - start) : context]
            mask = self._key_pos(tables.shape[1] * batch.block_size)[None, :] <= q_pos[:, None]
            chunks.append(_Chunk(start, end, tables[0], mask))
        return TorchAttentionMetadata(batch.slot_mapping, short, chunks)

    def _short_batch(self, batch: AttentionBatch, n: int) -> _ShortBatch:
        qlens = batch.query_lens[:n]
        max_query = max(int(qlens.max()), MIN_QUERY_ROWS)
        width = int(batch.table_lens[:n].max())
        i = self.arange[:max_query]
        # Query i of a sequence sits at position context_len - query_len + i and sees
        # the keys up to it; pad queries copy the last real one: `real` is the query
        # that each of the [n, max_query] slots holds.
        real = np.minimum(i, qlens[:, None] - 1)
        size = n * max_query
        q_pos = self.q_pos.np[:size].reshape(n, max_query)
        np.add((batch.context_lens[:n] - qlens)[:, None], real, out=q_pos)
        np.add(batch.query_start[:n, None], real, out=self.pad_index.np[:size].reshape(n, -1))
        num_tokens = int(batch.query_start[n])
        # Row-major, the real slots of the [n, max_query] padding are the flat rows' order.
        self.unpad_index.np[:num_tokens] = np.flatnonzero(i < qlens[:, None])
        q_pos_t = self.q_pos.copy(size).view(n, 1, max_query, 1)
        # Every layer gathers through the tables: narrower than a chunk's, they are
        # copied once here rather than flattened in each layer.
        tables = _padded(batch.block_tables[:n, :width], batch.block_size).contiguous()
        mask = self._key_pos(tables.shape[1] * batch.block_size) <= q_pos_t
        return _ShortBatch(
            num_tokens,
            tables,
            max_query,
            mask,
            self.pad_index.copy(size),
            self.unpad_index.copy(num_tokens),
        )


def key_width(num_keys: int, block_size: int) -> int:
    """Keys attended for num_keys cached ones: as they are up to SMALL_KEYS, else up to a
    multiple of KV_SPLIT that is whole blocks (see SMALL_KEYS)."""
    if num_keys <= SMALL_KEYS:
        return num_keys
    step = math.lcm(KV_SPLIT, block_size)
    return -(-num_keys // step) * step


def _padded(tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block tables widened with block 0 (masked like any padding) to key_width."""
    width = tables.shape[1]
    blocks = key_width(width * block_size, block_size) // block_size
    return F.pad(tables, (0, blocks - width)) if blocks > width else tables


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The blocks' tokens in order, in `dtype`: [..., num_blocks * block_size, kv_heads,
    head_dim].

    index_select copies whole blocks and is about 3x faster on CPU than
    advanced indexing (cache[block_ids]), which goes element by element.
    """
    blocks = cache.index_select(0, block_ids.flatten()).to(dtype)
    return blocks.view(*block_ids.shape[:-1], -1, *cache.shape[-2:])

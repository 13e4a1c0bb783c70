"""Attention by torch's SDPA over the paged cache: gathers each sequence's blocks and
runs on any device. InputBatch puts the short queries (decodes, verifications) first,
and they are attended as one padded batch; prefill chunks one sequence at a time.

TorchAttention computes every query row the same way whatever else is in the step,
so greedy output does not depend on batching, chunking or speculation even where
the linear layers round activations to bfloat16 (which turns a 1e-7 difference
into a different token now and then). SDPA's CPU kernel gives a row bit-identical
results when (measured on torch 2.13) its keys are padded to a multiple of 16
under an explicit mask, never sliced to the exact length or masked by is_causal,
and its sequence has at least 4 query rows: keys run to whole blocks and short
queries are padded to MIN_QUERY_ROWS. (On an Intel Xeon 3 rows sufficed; on an AMD
EPYC with AVX-512 BF16 a 3-row batch of one sequence got other bits than the same
rows beside others, while from 4 rows on a row's bits depended on neither the batch
size, the query count nor the key padding.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from engine.attention import AttentionBackend, AttentionBatch, AttentionSpec, StepLimits
from engine.staged_buffer import StagedBuffer

# Queries up to this long join the padded batch; longer ones (prefill chunks) are
# attended one sequence at a time, where padding would waste more than it saves.
MAX_SHORT_QUERY = 16
# Short queries are padded to at least this many rows (see the module docstring).
MIN_QUERY_ROWS = 4
# Key padding (measured on torch 2.13's CPU kernel, 3 and 9 query rows): a row whose
# context is at most ~195 keys gets the same bits at every padded width up to 2048; a
# longer one gets other bits at widths whose last 512-key split (the kernel's kv split
# size) is partly filled, but the same at every multiple of 512. So keys past
# SMALL_KEYS are padded to a multiple of 512: a row's bits then depend neither on the
# widest sequence of its batch nor on blocks held for a sequence's proposals.
SMALL_KEYS = 192
KV_SPLIT = 512


@dataclass
class _Chunk:
    start: int
    end: int
    block_ids: torch.Tensor
    mask: torch.Tensor  # [query, keys of its whole blocks]


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


class TorchAttention(AttentionBackend):
    """SDPA over the paged cache: gathers each sequence's blocks, runs anywhere."""

    name = "torch"
    max_short_query = MAX_SHORT_QUERY
    # Keys run to whole blocks, and a row's bits hold only with keys padded to a
    # multiple of 16 (see the module docstring).
    block_size_multiple = 16
    preferred_block_size = 16
    # Its masks are as wide as the step's longest context: eager steps only.
    graphable = False

    @staticmethod
    def unsupported(spec: AttentionSpec) -> str | None:
        return None  # SDPA runs on every device and dtype

    def metadata_builder(self, limits: StepLimits) -> TorchMetadataBuilder:
        return TorchMetadataBuilder(self.spec.device, limits)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: TorchAttentionMetadata
    ) -> Tensor:
        num_tokens, num_heads, head_dim = q.shape
        # A cache of another dtype (kv_cache_dtype) stores rounded keys and values;
        # attention runs in the model's dtype on them, widened back.
        k_cache, v_cache = self.write_kv(kv_cache, k, v, meta.slot_mapping)
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
    """TorchAttention's metadata, in buffers sized once for the largest step: index
    tensors and padded block tables staged from the host, masks computed into a
    device buffer (the short batch's first, then each chunk's)."""

    def __init__(self, device: torch.device, limits: StepLimits) -> None:
        self.block_size = limits.block_size
        self.max_blocks = key_width(limits.max_blocks * self.block_size, self.block_size) // (
            self.block_size
        )
        max_keys = self.max_blocks * self.block_size
        # Every short query padded to MAX_SHORT_QUERY (>= MIN_QUERY_ROWS) rows at most.
        size = limits.max_num_seqs * MAX_SHORT_QUERY
        self.q_pos = StagedBuffer(size, device)
        self.pad_index = StagedBuffer(size, device)
        self.unpad_index = StagedBuffer(size, device)
        self.arange = np.arange(MAX_SHORT_QUERY, dtype=np.int64)
        # The short batch's padded tables, or each chunk's, one after another.
        self.tables = StagedBuffer(limits.max_num_seqs * self.max_blocks, device)
        self.key_pos = torch.arange(max_keys, device=device)  # each key's position
        # Short queries' rows plus every chunk's rows, each as wide as its keys.
        rows = size + limits.max_num_tokens
        self.masks = torch.empty(rows * max_keys, dtype=torch.bool, device=device)

    def build(self, batch: AttentionBatch) -> TorchAttentionMetadata:
        # InputBatch put the short queries first (max_short_query).
        num_short = int(np.count_nonzero(batch.query_lens <= MAX_SHORT_QUERY))
        short = self._short_batch(batch, num_short) if num_short else None
        masks_used = short.mask.numel() if short is not None else 0
        spans: list[tuple[int, int, int, int, torch.Tensor]] = []  # start, end, tables
        tables_used = short.block_tables.numel() if short is not None else 0
        for i in range(num_short, len(batch.query_lens)):
            start, end = int(batch.query_start[i]), int(batch.query_start[i + 1])
            context = int(batch.context_lens[i])
            length = int(batch.table_lens[i])
            width = self._padded_width(length)
            self._pad_tables(batch.block_tables[i : i + 1, :length], width, tables_used)
            # Query j sits at position past + j and sees keys 0..past + j.
            q_pos = self.key_pos[context - (end - start) : context]
            keys = width * self.block_size
            mask = self.masks[masks_used : masks_used + (end - start) * keys].view(-1, keys)
            torch.le(self.key_pos[None, :keys], q_pos[:, None], out=mask)
            spans.append((start, end, tables_used, width, mask))
            masks_used += mask.numel()
            tables_used += width
        tables = self.tables.copy(tables_used)
        chunks = [_Chunk(s, e, tables[at : at + w], mask) for s, e, at, w, mask in spans]
        return TorchAttentionMetadata(batch.slot_mapping, short, chunks)

    def _padded_width(self, num_blocks: int) -> int:
        """Blocks attended for a table of num_blocks: to key_width's padding."""
        return key_width(num_blocks * self.block_size, self.block_size) // self.block_size

    def _pad_tables(self, tables: np.ndarray, width: int, at: int) -> None:
        """Block tables ([rows, w]) into the staged tables from `at` on, each row
        widened to `width` with block 0 (masked like any padding)."""
        rows, w = tables.shape
        out = self.tables.np[at : at + rows * width].reshape(rows, width)
        out[:, :w] = tables
        out[:, w:] = 0

    def _short_batch(self, batch: AttentionBatch, n: int) -> _ShortBatch:
        qlens = batch.query_lens[:n]
        max_query = max(int(qlens.max()), MIN_QUERY_ROWS)
        width = self._padded_width(int(batch.table_lens[:n].max()))
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
        self._pad_tables(batch.block_tables[:n, : int(batch.table_lens[:n].max())], width, 0)
        q_pos_t = self.q_pos.copy(n, 1, max_query, 1)
        keys = width * self.block_size
        mask = self.masks[: size * keys].view(n, 1, max_query, keys)
        torch.le(self.key_pos[:keys], q_pos_t, out=mask)
        return _ShortBatch(
            num_tokens,
            self.tables.copy(n, width),
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


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The blocks' tokens in order, in `dtype`: [..., num_blocks * block_size, kv_heads,
    head_dim].

    index_select copies whole blocks and is about 3x faster on CPU than
    advanced indexing (cache[block_ids]), which goes element by element.
    """
    blocks = cache.index_select(0, block_ids.flatten()).to(dtype)
    return blocks.view(*block_ids.shape[:-1], -1, *cache.shape[-2:])

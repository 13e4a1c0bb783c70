"""The attention-backend seam.

A backend receives, per layer, the step's new q/k/v for a flat batch of tokens
and that layer's paged KV cache ([2, num_blocks, block_size, kv_heads,
head_dim]); it writes the new k/v into their cache slots and returns the
attention output. Metadata is built once per step and shared by every layer.
The model runner orders a batch as decodes (one query token each) first, then
speculating decodes (the last token plus a few proposed ones), then prefill
chunks, so a backend can treat the leading short queries as one padded batch.

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

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SequenceSlice:
    """What attention needs to know of one sequence in the flat batch."""

    query_len: int  # tokens of this sequence in this step
    context_len: int  # tokens in its cache after this step (earlier ones + query)
    block_table: list[int]


class AttentionBackend(Protocol):
    name: str

    def build_metadata(
        self, seqs: list[SequenceSlice], slot_mapping: torch.Tensor, block_size: int
    ) -> Any: ...

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

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _tensor(self, values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(self.device, non_blocking=True)

    def build_metadata(
        self, seqs: list[SequenceSlice], slot_mapping: torch.Tensor, block_size: int
    ) -> TorchAttentionMetadata:
        num_short = 0
        while num_short < len(seqs) and seqs[num_short].query_len <= MAX_SHORT_QUERY:
            num_short += 1
        short = self._short_batch(seqs[:num_short], block_size) if num_short else None
        chunks: list[_Chunk] = []
        start = short.num_tokens if short else 0
        for s in seqs[num_short:]:
            end = start + s.query_len
            # Query i sits at position past + i and sees keys 0..past + i.
            q_pos = torch.arange(s.context_len - s.query_len, s.context_len, device=self.device)
            k_pos = torch.arange(len(s.block_table) * block_size, device=self.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            chunks.append(_Chunk(start, end, self._tensor(s.block_table), mask))
            start = end
        return TorchAttentionMetadata(slot_mapping, short, chunks)

    def _short_batch(self, seqs: list[SequenceSlice], block_size: int) -> _ShortBatch:
        width = max(len(s.block_table) for s in seqs)
        tables = self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs])
        lens = [s.context_len for s in seqs]
        qlens = [s.query_len for s in seqs]
        max_query = max(*qlens, MIN_QUERY_ROWS)
        num_tokens = sum(qlens)
        # Query i of a sequence sits at position context_len - query_len + i and sees
        # the keys up to it; pad queries copy the last real one.
        lens_t, qlens_t = self._tensor(lens), self._tensor(qlens)
        i = torch.arange(max_query, device=self.device)
        q_pos = lens_t[:, None] - qlens_t[:, None] + torch.minimum(i[None, :], qlens_t[:, None] - 1)
        key_pos = torch.arange(width * block_size, device=self.device)
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]).unsqueeze(1)
        starts = torch.cumsum(qlens_t, 0) - qlens_t
        pad_index = (starts[:, None] + torch.minimum(i[None, :], qlens_t[:, None] - 1)).flatten()
        slot = torch.arange(len(seqs), device=self.device)[:, None] * max_query + i[None, :]
        unpad_index = slot[i[None, :] < qlens_t[:, None]]
        return _ShortBatch(num_tokens, tables, max_query, mask, pad_index, unpad_index)

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
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
        short = meta.short
        if not meta.chunks:  # only short queries: nothing to assemble
            assert short is not None
            return self._short(q, k_cache, v_cache, short).reshape(num_tokens, -1)
        out = q.new_empty(q.shape)
        if short is not None:
            out[: short.num_tokens] = self._short(q[: short.num_tokens], k_cache, v_cache, short)
        for c in meta.chunks:
            keys = _gather(k_cache, c.block_ids).transpose(0, 1)
            values = _gather(v_cache, c.block_ids).transpose(0, 1)
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
        keys = _gather(k_cache, short.block_tables).transpose(1, 2)
        values = _gather(v_cache, short.block_tables).transpose(1, 2)
        n, heads, dim = short.block_tables.shape[0], q.shape[1], q.shape[2]
        padded = q.index_select(0, short.pad_index).view(n, short.max_query, heads, dim)
        out = F.scaled_dot_product_attention(
            padded.transpose(1, 2), keys, values, attn_mask=short.mask, enable_gqa=True
        )
        out = out.transpose(1, 2).reshape(n * short.max_query, heads, dim)
        return out.index_select(0, short.unpad_index)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The blocks' tokens in order: [..., num_blocks * block_size, kv_heads, head_dim].

    index_select copies whole blocks and is about 3x faster on CPU than
    advanced indexing (cache[block_ids]), which goes element by element.
    """
    blocks = cache.index_select(0, block_ids.flatten())
    return blocks.view(*block_ids.shape[:-1], -1, *cache.shape[-2:])


def select_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    if name in ("auto", "torch"):
        return TorchAttention(device)
    raise ValueError(f"unknown attention backend {name!r} (available: torch)")

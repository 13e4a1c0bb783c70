"""The attention-backend seam.

A backend receives, per layer, the step's new q/k/v for a flat batch of tokens
and that layer's paged KV cache ([2, num_blocks, block_size, kv_heads,
head_dim]); it writes the new k/v into their cache slots and returns the
attention output. Metadata is built once per step and shared by every layer.
The model runner orders a batch as decodes (one query token each) first, then
prefill chunks, so a backend can treat the decodes as one padded batch.
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
    context_len: int
    mask: torch.Tensor | None  # None: plain causal (the chunk is the whole context)


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks]
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, decode_keys]; None: all valid
    decode_keys: int  # key positions the decode batch attends over
    chunks: list[_Chunk]


class TorchAttention:
    """SDPA over the paged cache: gathers each sequence's blocks, runs anywhere."""

    name = "torch"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def build_metadata(
        self, seqs: list[SequenceSlice], slot_mapping: torch.Tensor, block_size: int
    ) -> TorchAttentionMetadata:
        num_decodes = 0
        while num_decodes < len(seqs) and seqs[num_decodes].query_len == 1:
            num_decodes += 1
        tables = mask = None
        decode_keys = 0
        if num_decodes:
            decodes = seqs[:num_decodes]
            width = max(len(s.block_table) for s in decodes)
            tables = torch.tensor(
                [s.block_table + [0] * (width - len(s.block_table)) for s in decodes],
                dtype=torch.long,
            ).to(self.device, non_blocking=True)
            lens = [s.context_len for s in decodes]
            if min(lens) == max(lens):
                # Equal contexts (always so for a single stream): slice, no mask,
                # which lets SDPA skip the masking work.
                decode_keys = lens[0]
            else:
                decode_keys = width * block_size
                lens_t = torch.tensor(lens).to(self.device, non_blocking=True)
                key_pos = torch.arange(decode_keys, device=self.device)
                mask = (key_pos[None, :] < lens_t[:, None]).view(num_decodes, 1, 1, -1)
        chunks: list[_Chunk] = []
        start = num_decodes
        for s in seqs[num_decodes:]:
            end = start + s.query_len
            past = s.context_len - s.query_len
            chunk_mask = None
            if past:
                # Query i sits at position past + i and sees keys 0..past + i.
                q_pos = torch.arange(past, s.context_len, device=self.device)
                k_pos = torch.arange(s.context_len, device=self.device)
                chunk_mask = k_pos[None, :] <= q_pos[:, None]
            blocks = torch.tensor(s.block_table, dtype=torch.long).to(
                self.device, non_blocking=True
            )
            chunks.append(_Chunk(start, end, blocks, s.context_len, chunk_mask))
            start = end
        return TorchAttentionMetadata(slot_mapping, num_decodes, tables, mask, decode_keys, chunks)

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
        n = meta.num_decodes
        if not meta.chunks:  # a pure decode step: nothing to assemble
            return self._decode(q, k_cache, v_cache, meta).reshape(num_tokens, -1)
        out = q.new_empty(q.shape)
        if n:
            out[:n] = self._decode(q[:n], k_cache, v_cache, meta)
        for c in meta.chunks:
            keys = _gather(k_cache, c.block_ids)[: c.context_len].transpose(0, 1)
            values = _gather(v_cache, c.block_ids)[: c.context_len].transpose(0, 1)
            out[c.start : c.end] = F.scaled_dot_product_attention(
                q[c.start : c.end].transpose(0, 1).unsqueeze(0),
                keys.unsqueeze(0),
                values.unsqueeze(0),
                attn_mask=c.mask,
                is_causal=c.mask is None,
                enable_gqa=True,
            )[0].transpose(0, 1)
        return out.view(num_tokens, num_heads * head_dim)

    @staticmethod
    def _decode(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TorchAttentionMetadata
    ) -> torch.Tensor:
        """The leading one-token queries as one padded batch: [num_decodes, heads, head_dim]."""
        keys = _gather(k_cache, meta.decode_block_tables)[:, : meta.decode_keys]
        values = _gather(v_cache, meta.decode_block_tables)[:, : meta.decode_keys]
        return F.scaled_dot_product_attention(
            q.unsqueeze(2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=meta.decode_mask,
            enable_gqa=True,
        ).squeeze(2)


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

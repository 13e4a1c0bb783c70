"""The attention-backend seam.

A backend receives, per layer, the step's new q/k/v for a flat batch of tokens and
that layer's paged KV cache; it writes the new k/v into their cache slots and
returns the attention output. Each backend owns the cache layout it reads (and
allocates it), says which block sizes it takes, and builds its per-step metadata
into buffers allocated once, shared by every layer of the step.

Backends live one to a file (torch_attention.py, cpu_attention.py,
flash_attention.py); engine/attention_backends.py is their registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

import numpy as np
import torch
from torch import Tensor

from engine.kv_cache import allocate_kv_cache


@dataclass(frozen=True)
class AttentionSpec:
    """What a backend must support to serve a model."""

    device: torch.device
    dtype: torch.dtype  # the model's activations
    kv_cache_dtype: torch.dtype
    head_dim: int


@dataclass(frozen=True)
class StepLimits:
    """The largest step a metadata builder must hold: its buffers' capacities."""

    max_num_seqs: int
    max_num_tokens: int
    max_blocks: int  # blocks in one sequence's table
    block_size: int
    null_block: int  # the KV block that padding reads and writes (see InputBatch)


@dataclass
class AttentionBatch:
    """The step as an attention backend sees it, rows in the backend's order. The
    arrays are host views of InputBatch's persistent buffers, valid until the next
    build; slot_mapping is on the device."""

    block_size: int
    query_lens: np.ndarray  # [n] each row's tokens this step (padding included)
    context_lens: np.ndarray  # [n] tokens in its cache after the step (earlier + query)
    query_start: np.ndarray  # [n + 1] each row's first flat token, then the total
    table_lens: np.ndarray  # [n] blocks in its table (enough for context_lens)
    # [n, >= max table_lens], padded with the null block; rows at any stride (views of
    # the persistent batch's rows)
    block_tables: np.ndarray
    slot_mapping: torch.Tensor  # [tokens] on the device: each token's KV slot


class AttentionMetadataBuilder(Protocol):
    def build(self, batch: AttentionBatch) -> Any: ...


class AttentionBackend(ABC):
    """An attention backend, and what the backends share: the common cache layout,
    [2 (k, v), num_blocks, block_size, kv_heads, head_dim] per layer, in the KV cache
    dtype on the model's device (flash-attn's paged layout: K and V each [num_pages,
    page_size, kv_heads, head_dim]), and how the registry asks a backend class about a
    model."""

    name: ClassVar[str]
    # How a block's bytes are laid out in the cache: blocks are shared through a KV store
    # (engine/kv_block_codec.py) only between caches of one layout.
    kv_layout: ClassVar[str] = "common"
    # What the backend needs of the batch: its queries of at most max_short_query tokens
    # first (0: rows in any order), and a block size that is a multiple of
    # block_size_multiple (preferred_block_size when the config sets none). InputBatch
    # orders the rows and checks the block size.
    max_short_query: ClassVar[int]
    block_size_multiple: ClassVar[int]
    preferred_block_size: ClassVar[int]
    # Whether a decode step's metadata has the same tensors, shapes and host values for
    # every step of one batch size, so that the step can be captured as a CUDA graph.
    graphable: ClassVar[bool]

    def __init__(self, spec: AttentionSpec) -> None:
        self.spec = spec

    @staticmethod
    @abstractmethod
    def unsupported(spec: AttentionSpec) -> str | None:
        """Why this backend cannot serve a model of this spec, or None if it can."""

    @classmethod
    def create(cls, spec: AttentionSpec) -> Self:
        """The backend for a model that `unsupported` accepted."""
        return cls(spec)

    @abstractmethod
    def metadata_builder(self, limits: StepLimits) -> AttentionMetadataBuilder:
        """A builder of this backend's metadata into its own persistent buffers."""

    @abstractmethod
    def forward(self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: Any) -> Tensor:
        """Writes the step's k and v into their cache slots and attends: [tokens, heads *
        head_dim]. `meta` is what this backend's metadata builder built for the step."""

    def allocate_kv_cache(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> list[torch.Tensor]:
        """Each layer's cache, in the layout this backend reads."""
        s = self.spec
        return allocate_kv_cache(
            num_layers, num_blocks, block_size, num_kv_heads, head_dim, s.kv_cache_dtype, s.device
        )

    @staticmethod
    def write_kv(
        kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the step's keys and values ([tokens, kv_heads, head_dim]) into their
        slots of a layer's cache in the common layout (a cache of another dtype stores
        them rounded); returns its K and V. The CPU kernel, which keeps its keys in
        another order, writes its own."""
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        kv_heads, head_dim = k_cache.shape[-2:]
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
        return k_cache, v_cache

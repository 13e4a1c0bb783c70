"""Paged KV cache: the block manager (pure bookkeeping) and the cache tensors.

Blocks hold `block_size` tokens of KV for every layer. A full block is named
by a chained sha256 (its parent's hash and its own token ids; the first block's
parent hashes the cache salt), so two sequences with the same prefix under the
same salt map to the same blocks: automatic prefix caching. Freed blocks keep
their contents and hash until they are reused, least recently freed first, so a
later request can still hit them.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq

import torch

from engine.sequence import Sequence


class Block:
    __slots__ = ("block_hash", "block_id", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None


# Every parent, the root included, is a 32-byte digest, so a hash's input (parent, then 4
# bytes a token id) splits one way only: no two (parent, token ids) pairs share an input.
_UNSALTED_ROOT = hashlib.sha256(b"semgate:no-cache-salt").digest()


def chain_hash(parent: bytes, token_ids: Seq[int]) -> bytes:
    """A full block's name: sha256 over its parent's hash and its own token ids (native
    uint32s; hashes live in one process, so byte order need not be portable). Unlike
    Python's `hash`, no two prefixes share a name in practice, and crafted prompts cannot
    make them (vLLM's `hash_block_tokens`, sha256 mode). Inputs that change a block's KV
    besides its tokens (vLLM's extra keys: a LoRA adapter, multimodal inputs) would join
    the salt in `root_hash`, or this block's bytes; the engine has none yet."""
    # ~0.8 us per 16-token block here (xxh3_128 ~0.4, Python's hash ~0.23): ~0.1 ms for a
    # 2k-token prompt. xxhash is not a dependency, nor built to resist crafted collisions.
    return hashlib.sha256(parent + array("I", token_ids).tobytes()).digest()


def root_hash(cache_salt: str | None) -> bytes:
    """The parent of the first block of a sequence with this salt. A cache salt (vLLM's
    `cache_salt`; the gateway salts by tenant) starts its own chain, and every block's hash
    carries its root, so only requests with the same salt share blocks: nobody can time
    another tenant's prompts through prefix hits."""
    if cache_salt is None:
        return _UNSALTED_ROOT
    # surrogatepass: a JSON string may hold a lone surrogate, which plain UTF-8 refuses
    # (in the step loop); the encoding stays one-to-one.
    salt = cache_salt.encode("utf-8", "surrogatepass")
    return hashlib.sha256(b"semgate:cache-salt:" + salt).digest()


def prompt_block_hashes(seq: Sequence, block_size: int) -> list[bytes]:
    """The chained hashes of seq's full blocks short of its last token (which is computed
    for its logits): the names find_cached_prefix looks up, all of them."""
    hashes: list[bytes] = []
    parent = root_hash(seq.cache_salt)
    tokens = seq.token_ids
    for i in range((len(tokens) - 1) // block_size):
        parent = chain_hash(parent, tokens[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (front = least recently freed).
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, int] = {}  # block hash -> block id

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / len(self.blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """Cached blocks (ids and hashes) for the longest full-block prefix of seq's
        tokens, under its salt.

        Stops one token short of the end: the last token must be computed to
        produce the logits for the next one.
        """
        if not self.enable_prefix_caching:
            return [], []
        ids: list[int] = []
        hashes: list[bytes] = []
        parent = root_hash(seq.cache_salt)
        token_ids = seq.token_ids
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            parent = chain_hash(parent, token_ids[i * bs : (i + 1) * bs])
            # No check of the block's token ids: equal 256-bit hashes mean equal prefixes.
            block_id = self.cached.get(parent)
            if block_id is None:
                break
            ids.append(block_id)
            hashes.append(parent)
        return ids, hashes

    def allocate(
        self,
        seq: Sequence,
        num_tokens: int,
        cached_ids: Seq[int] = (),
        cached_hashes: Seq[bytes] = (),
    ) -> bool:
        """Grows seq's block table to hold num_tokens tokens; False if blocks run out.

        cached_ids (from find_cached_prefix) are shared first, for a sequence
        that has no blocks yet.
        """
        need = -(-num_tokens // self.block_size) - len(seq.block_table) - len(cached_ids)
        if need <= 0 and not cached_ids:  # most decodes: the last block has room
            return True
        # Cached blocks that nobody holds sit in the free list: using them
        # takes them out of it, so they are not available for the new ones.
        idle_cached = sum(1 for b in cached_ids if self.blocks[b].ref_count == 0)
        if need > len(self.free) - idle_cached:
            return False
        for block_id in cached_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.block_hashes.extend(cached_hashes)
        for _ in range(max(need, 0)):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None and self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.ref_count = 1
            seq.block_table.append(block_id)
        return True

    def _release(self, block_id: int, reuse_first: bool = False) -> None:
        """Drops one holder of a block; a block nobody holds joins the free list, at its
        end (evicted last: a later request may still hit it) unless `reuse_first`."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block_id] = None
            if reuse_first:
                self.free.move_to_end(block_id, last=False)

    def free_sequence(self, seq: Sequence) -> None:
        # Tail blocks first, so they are evicted before the shared-prefix blocks.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.block_hashes = []

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Gives back seq's blocks beyond num_tokens (slots of rejected proposals, or
        reserved for proposals that were then dropped). They hold nothing worth
        keeping, so they are reused first."""
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop(), reuse_first=True)

    def forget_hashes(self, seq: Sequence) -> None:
        """Un-names seq's blocks past its computed tokens: async scheduling names a step's
        blocks when it launches it (engine/async_scheduler.py), and an abort takes the
        step back. No other request can have hit them: none was scheduled since."""
        keep = seq.num_computed_tokens // self.block_size
        while len(seq.block_hashes) > keep:
            block_hash = seq.block_hashes.pop()
            block = self.blocks[seq.block_table[len(seq.block_hashes)]]
            if self.cached.get(block_hash) == block.block_id:
                del self.cached[block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block (vLLM's `reset_prefix_cache`). Only while no request
        holds a block, since a running sequence's hashes name its blocks: False if one does."""
        if self.num_free_blocks != self.num_blocks:
            return False
        self.cached.clear()
        for block in self.blocks:
            block.block_hash = None
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Names seq's newly completed blocks so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            parent = seq.block_hashes[-1] if seq.block_hashes else root_hash(seq.cache_salt)
            block_hash = chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs])
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[i]]
            block.block_hash = block_hash
            self.cached.setdefault(block_hash, block.block_id)


def kv_cache_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize


_FRESH_MMAP_BYTES = 64 << 20  # above glibc's largest dynamic mmap threshold (32 MiB)


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One tensor, viewed per layer as [2 (k, v), num_blocks, block_size, kv_heads, head_dim].

    Attention masks unused slots, but a NaN there would still poison the
    softmax-weighted sum (attention reads whole blocks, unwritten slots too), so
    the cache must start finite. On CPU an allocation over glibc's largest mmap
    threshold (32 MiB) is fresh anonymous memory, which the kernel hands out
    zeroed page by page on first touch: torch.empty avoids a second of page
    faults at start for the default 1 GiB. A smaller one may reuse freed heap
    memory, so it is zeroed, as is device memory (a caching allocator's).
    """
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    fresh = device.type == "cpu" and nbytes > _FRESH_MMAP_BYTES
    cache = (torch.empty if fresh else torch.zeros)(shape, dtype=dtype, device=device)
    return list(cache.unbind(0))

"""One KV block as bytes in a store: a small header, then the block's K and V of every
layer exactly as the cache holds them (its dtype, its backend's layout).

The header says what the bytes are, so that a value is loaded only into the cache it
came from: the format version, a digest of the layout (model, KV dtype, attention
layout, block size, cache shape), the block's own hash (the salted chain that names it:
a value stored under another block's key is refused), the token count, the payload's
length and its CRC-32. Anything else (a missing value, a short one, another layout, a
bad checksum) is a failure with its reason, and the block is computed instead.
No JSON, no pickle: nothing in a value is ever executed or parsed beyond the header.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"SGKV"
VERSION = 1
# magic, version, token count, block hash (32), layout digest (16), payload bytes, CRC-32.
HEADER = struct.Struct("<4sHH32s16sQI")


@dataclass(frozen=True)
class KVLayout:
    """What a block's bytes mean: the same model, KV dtype, backend layout, block size and
    cache shape on both sides, or the bytes are not the same KV."""

    model: str  # engine/loaded_model.py's model key: the weights and how they were loaded
    kv_dtype: str
    attention_layout: str  # AttentionBackend.kv_layout
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def digest(self) -> bytes:
        text = "|".join(
            str(v)
            for v in (
                self.model,
                self.kv_dtype,
                self.attention_layout,
                self.block_size,
                self.num_layers,
                self.num_kv_heads,
                self.head_dim,
            )
        )
        return hashlib.sha256(text.encode()).digest()[:16]

    @property
    def block_bytes(self) -> int:
        """K and V of every layer for one block."""
        per_layer = 2 * self.block_size * self.num_kv_heads * self.head_dim * self.dtype_bytes
        return self.num_layers * per_layer


def encode_block(layout: KVLayout, block_hash: bytes, payload: memoryview) -> bytes:
    """A block's value: header, then payload (layout.block_bytes)."""
    header = HEADER.pack(
        MAGIC,
        VERSION,
        layout.block_size,
        block_hash,
        layout.digest,
        len(payload),
        zlib.crc32(payload),
    )
    return header + payload


def check_block(layout: KVLayout, block_hash: bytes, value: bytes | None) -> str | None:
    """Why `value` is not block `block_hash` of this layout (a failure reason for the
    metrics), or None when it is: then its payload is value[HEADER.size:]."""
    if value is None:
        return "missing"
    if len(value) < HEADER.size:
        return "truncated"
    magic, version, tokens, stored_hash, digest, length, crc = HEADER.unpack_from(value)
    if magic != MAGIC or version != VERSION:
        return "header"
    if digest != layout.digest or tokens != layout.block_size or stored_hash != block_hash:
        return "header"
    if length != layout.block_bytes or len(value) != HEADER.size + length:
        return "truncated"
    if zlib.crc32(memoryview(value)[HEADER.size :]) != crc:
        return "checksum"
    return None

"""Which servers served which prompt starts: SGLang's approximate radix tree, kept as
chained hashes of fixed-size blocks of the prompt (as the engines key their own prefix
caches' KV blocks, on bytes instead of tokens: the gateway has no tokenizer for remote
models). Bounded as those caches are: once a server holds `capacity` blocks its least
recently used go first, and a block nobody sent to it for `ttl` seconds counts as gone
(its server has likely evicted it, or restarted between two health checks)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Collection

BLOCK_BYTES = 128  # about 32 tokens: two of the engine's KV blocks
MAX_BLOCKS = 512  # only the start is hashed: 64 KiB of prompt, some 16k tokens
BYTES_PER_TOKEN = 4  # to size a table from a token count (English text, BPE)


def prompt_blocks(root: str, text: str) -> tuple[int, ...]:
    """The chained hashes of `text`'s whole blocks (a last partial block is left out):
    each hash stands for the whole prompt start up to its block. `root` keeps prompts
    that must not share apart (another model, another prefix-cache salt)."""
    data = text.encode()
    digest = hashlib.blake2b(root.encode(), digest_size=8).digest()
    blocks = []
    for start in range(0, min(len(data) // BLOCK_BYTES, MAX_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES):
        digest = hashlib.blake2b(digest + data[start : start + BLOCK_BYTES], digest_size=8).digest()
        blocks.append(int.from_bytes(digest))
    return tuple(blocks)


class PrefixTable:
    def __init__(
        self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if capacity < 1:
            raise ValueError("a prefix table holds at least one block per server")
        self.capacity = capacity
        self.ttl = ttl
        self._clock = clock
        self._holders: dict[int, dict[str, float]] = {}  # block -> server -> last sent
        self._lru: dict[str, OrderedDict[int, None]] = {}  # per server, oldest first

    def matches(self, blocks: tuple[int, ...], names: Collection[str]) -> dict[str, int]:
        """How many leading blocks of `blocks` each of the servers `names` holds (those
        that hold none are left out)."""
        now = self._clock()
        found: dict[str, int] = {}
        for depth, block in enumerate(blocks, 1):
            holders = self._holders.get(block, {})
            live = [n for n, at in holders.items() if n in names and now - at < self.ttl]
            if not live:
                break  # chained: a later block is the same prompt start, longer
            found.update(dict.fromkeys(live, depth))
        return found

    def record(self, name: str, blocks: tuple[int, ...]) -> None:
        """`blocks` were sent to `name`: its cache holds them now."""
        now = self._clock()
        lru = self._lru.setdefault(name, OrderedDict())
        # Last block first: a prompt's earlier blocks end up the more recently used, so
        # eviction cuts chains from their ends (as the engines' caches do) and a match
        # can stop at the first block nobody holds.
        for block in reversed(blocks):
            self._holders.setdefault(block, {})[name] = now
            lru[block] = None
            lru.move_to_end(block)
        while len(lru) > self.capacity:
            self._drop(lru.popitem(last=False)[0], name)

    def forget(self, name: str) -> None:
        """`name` lost its cache (it went down): nothing is routed to it for a prefix."""
        for block in self._lru.pop(name, {}):
            self._drop(block, name)

    def size(self, name: str) -> int:
        """Blocks held for `name`."""
        return len(self._lru.get(name, ()))

    def _drop(self, block: int, name: str) -> None:
        holders = self._holders.get(block)
        if holders is not None:
            holders.pop(name, None)
            if not holders:
                del self._holders[block]

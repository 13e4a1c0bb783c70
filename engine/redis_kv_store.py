"""The KV store in Redis (`semgate serve --kv-store redis://HOST:PORT/DB`): a KV connector
(engine/kv_connector.py) that saves every full block an engine computes and loads the
blocks of a prompt that any engine server on the same store computed before, as
LMCache's Redis backend does for vLLM.

Keys: `semgate:kv:<layout digest>:<block hash>`. The block hash is the prefix cache's
salted sha256 chain (engine/kv_cache.py), so a block is only ever found for the same
tokens after the same prefix under the same salt (tenant); the layout digest keeps
another model, KV dtype or cache layout apart. Values: engine/kv_block_codec.py.

Lookups ask Redis in the step loop, one pipelined EXISTS for a prompt's blocks, under a
short timeout; loads (one MGET for a request's blocks) and saves (one pipeline of SETs
per step) run on threads of their own, so a decode step never waits for Redis. A store
that is down or hangs trips the circuit breaker (resilience/), which skips it for a
while: every load that fails costs the time to compute those tokens, never a wrong one.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import redis.exceptions
import torch

from engine.kv_block_codec import HEADER, KVLayout, check_block, encode_block
from engine.kv_cache import prompt_block_hashes
from engine.kv_connector import KVConnector, KVFinished
from engine.metrics import KVTransferStats
from engine.sequence import Sequence
from resilience import CircuitBreaker
from resilience.redis_url import sync_client

log = logging.getLogger("semgate.engine")

LOOKUP_TIMEOUT = 0.25  # seconds: the step loop waits this long at most for a lookup
# Seconds without a byte from Redis before a load or save fails (a 4,000-token prompt's
# 90 MB arrive in a fraction of that on one host; the timeout is for a store that hangs).
TRANSFER_TIMEOUT = 1.0
CLOSE_TIMEOUT = 10.0  # seconds a closing store gives its queued saves
# Blocks this engine saved lately, not saved again (a prefix shared by many requests).
RECENT_SAVES = 65_536
# Saves queued for Redis, in bytes: beyond it a step's saves are dropped (and counted),
# so a slow store costs saves, never memory without bound or a waiting step.
MAX_QUEUED_SAVE_BYTES = 512 << 20


@dataclass
class _Load:
    request_id: str
    block_ids: list[int]
    hashes: list[bytes]


@dataclass
class _Save:
    hashes: list[bytes]
    host: torch.Tensor  # [blocks, block bytes] uint8, copied out of the cache
    ready: torch.cuda.Event | None  # the copy's event on CUDA (None: done)
    request_ids: list[str]
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.host.numel()


class RedisKVStore(KVConnector):
    def __init__(
        self,
        url: str,
        role: str,
        layout: KVLayout,
        *,
        ttl: int | None = None,
        device: torch.device,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.role = role
        self.layout = layout
        self.ttl = ttl
        self.device = device
        self.prefix = b"semgate:kv:" + layout.digest.hex().encode() + b":"
        self.lookups = sync_client(url, socket_timeout=LOOKUP_TIMEOUT)
        self.transfers = sync_client(url, socket_timeout=TRANSFER_TIMEOUT)
        self.breaker = breaker or CircuitBreaker(
            calls="KV store calls", skipped="the KV store", logger="semgate.engine"
        )
        self.stats = KVTransferStats()
        self._lock = threading.Lock()  # the stats, the breaker and what the threads report
        self._hashes: dict[str, list[bytes]] = {}  # a waiting request's prompt blocks
        # A waiting request's last lookup: (tokens computed then, blocks found). A request
        # at the head of a full queue is asked about every step: Redis once.
        self._found: dict[str, tuple[int, int]] = {}
        self._kv_caches: list[torch.Tensor] = []
        self._queued_loads: list[_Load] = []
        self._loading: set[str] = set()
        self._saved_upto: dict[str, int] = {}  # request id -> its blocks saved or skipped
        self._unsaved: dict[str, int] = {}  # request id -> its save jobs in flight
        self._save_failed: set[str] = set()  # requests a save of which failed
        self._held: set[str] = set()  # finished requests kept until their transfers end
        self._recent: OrderedDict[bytes, None] = OrderedDict()
        self._finished = KVFinished()
        self._queued_save_bytes = 0
        self._wake: Callable[[], None] = lambda: None
        self._loads: queue.SimpleQueue[_Load | None] = queue.SimpleQueue()
        self._saves: queue.SimpleQueue[_Save | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, args=(self._loads, self._load), daemon=True,
                             name="semgate-kv-load"),
            threading.Thread(target=self._run, args=(self._saves, self._save), daemon=True,
                             name="semgate-kv-save"),
        ]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def key(self, block_hash: bytes) -> bytes:
        return self.prefix + block_hash.hex().encode()

    # The scheduler's side.

    def get_num_new_matched_tokens(
        self, seq: Sequence, num_computed_tokens: int
    ) -> tuple[int, bool]:
        bs = self.layout.block_size
        hashes = self._hashes.get(seq.request_id) or prompt_block_hashes(seq, bs)
        self._hashes[seq.request_id] = hashes
        wanted = hashes[num_computed_tokens // bs :]
        last = self._found.get(seq.request_id)
        if last is not None and last[0] == num_computed_tokens:
            return last[1] * bs, True
        if not wanted or not self._allowed():
            return 0, True
        try:
            pipe = self.lookups.pipeline(transaction=False)
            for block_hash in wanted:
                pipe.exists(self.key(block_hash))
            found = pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._failed("lookup", exc, tokens=len(wanted) * bs)
            return 0, True
        self._succeeded()
        count = next((i for i, n in enumerate(found) if not n), len(found))
        self._found[seq.request_id] = (num_computed_tokens, count)
        return count * bs, True

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        bs = self.layout.block_size
        first = seq.num_computed_tokens // bs
        count = num_external_tokens // bs
        self._found.pop(seq.request_id, None)
        hashes = self._hashes.pop(seq.request_id)[first : first + count]
        load = _Load(seq.request_id, seq.block_table[first : first + count], hashes)
        self._queued_loads.append(load)
        with self._lock:
            self._loading.add(seq.request_id)

    def request_finished(self, seq: Sequence) -> tuple[bool, dict[str, Any] | None]:
        rid = seq.request_id
        self._hashes.pop(rid, None)
        self._found.pop(rid, None)
        params = seq.kv_transfer_params or {}
        # A prefill server's answer names what it saved, in vLLM's NixlConnector's fields
        # (the decode server finds the blocks by hash: it needs none of them).
        answer = None
        if params.get("do_remote_decode") and self.role != "decode":
            answer = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.prefix.decode(),
                "remote_block_ids": list(seq.block_table[: len(seq.block_hashes)]),
                "remote_host": None,
                "remote_port": None,
                "remote_request_id": rid,
                "num_saved_tokens": len(seq.block_hashes) * self.layout.block_size,
            }
        if self.role != "decode":
            self._save_new_blocks([seq])  # its last ones: its step's forward is over
        # Its blocks are kept while a save reads them or a load writes them, and a prefill
        # answer waits for its saves: it is released once they are done (perhaps now).
        with self._lock:
            keep = answer is not None or rid in self._unsaved or rid in self._loading
            if keep:
                self._held.add(rid)
                self._release_if_done(rid)
            else:
                self._save_failed.discard(rid)
        if not keep:
            self._saved_upto.pop(rid, None)
        return keep, answer

    # The runner's side.

    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        self._kv_caches = kv_caches

    def start_load_kv(self) -> None:
        for load in self._queued_loads:
            self._loads.put(load)
        self._queued_loads = []

    def save_kv(self, seqs: Seq[Sequence]) -> None:
        if self.role != "decode":
            self._save_new_blocks(seqs)

    def _save_new_blocks(self, seqs: Seq[Sequence]) -> None:
        """Queues the full blocks of seqs not saved yet (nor lately by another request),
        copied out of the cache now; a save queue already full drops them (counted)."""
        hashes: list[bytes] = []
        block_ids: list[int] = []
        request_ids: list[str] = []
        for seq in seqs:
            start = self._saved_upto.get(seq.request_id, 0)
            new = range(start, len(seq.block_hashes))
            self._saved_upto[seq.request_id] = len(seq.block_hashes)
            fresh = [i for i in new if seq.block_hashes[i] not in self._recent]
            if fresh:
                hashes += [seq.block_hashes[i] for i in fresh]
                block_ids += [seq.block_table[i] for i in fresh]
                request_ids.append(seq.request_id)
        if not hashes:
            return
        nbytes = len(hashes) * self.layout.block_bytes
        with self._lock:
            dropped = self._queued_save_bytes + nbytes > MAX_QUEUED_SAVE_BYTES
            if dropped:
                self.stats.fail("save_dropped", len(hashes) * self.layout.block_size)
                self._save_failed.update(request_ids)
                return
            self._queued_save_bytes += nbytes
            for rid in request_ids:
                self._unsaved[rid] = self._unsaved.get(rid, 0) + 1
        for block_hash in hashes:
            self._remember(block_hash)
        self._saves.put(self._copy_out(hashes, block_ids, request_ids))

    def _copy_out(
        self,
        hashes: list[bytes],
        block_ids: list[int],
        request_ids: list[str],
    ) -> _Save:
        """The blocks' bytes, [block][layer][k, v][slot...] as a value holds them, copied
        out now: once the step is over their blocks may be given to another request. On
        CUDA the copy is queued on the current stream (anything that later writes those
        blocks comes after it) into pinned memory, and the save thread waits for it."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        blocks = torch.stack([kv.index_select(1, ids) for kv in self._kv_caches])  # [L, 2, n]
        blocks = blocks.transpose(0, 2).transpose(1, 2)  # [n, L, 2, ...]
        flat = blocks.contiguous().view(len(block_ids), -1).view(torch.uint8)
        if self.device.type != "cuda":
            return _Save(hashes, flat, None, request_ids)
        host = torch.empty(flat.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return _Save(hashes, host, ready, request_ids)

    def get_finished(self) -> KVFinished:
        with self._lock:
            finished, self._finished = self._finished, KVFinished()
        for rid in finished.released:
            self._held.discard(rid)
            self._saved_upto.pop(rid, None)
        return finished

    def pending(self) -> bool:
        with self._lock:
            return bool(self._loading or self._unsaved or self._queued_loads)

    def on_progress(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def close(self) -> None:
        self._loads.put(None)
        self._saves.put(None)
        for thread in self._threads:
            thread.join(timeout=CLOSE_TIMEOUT)
        self.lookups.close()
        self.transfers.close()

    # The threads.

    @staticmethod
    def _run(jobs: queue.SimpleQueue[Any], work: Callable[[Any], None]) -> None:
        # One thread of torch's pool: the copies are small, and the engine's threads
        # are the forward's (a pool per thread would oversubscribe the cores).
        torch.set_num_threads(1)
        while (job := jobs.get()) is not None:
            try:
                work(job)
            except Exception:  # never lose the thread: the job's blocks count as failed
                log.exception("KV store transfer failed")

    def _load(self, load: _Load) -> None:
        """Loads a request's blocks, in order, up to the first that fails."""
        started = time.perf_counter()
        loaded = 0
        try:
            if not self._allowed():
                raise redis.exceptions.ConnectionError("the KV store is skipped (breaker open)")
            # bytes: the client is not asked to decode responses.
            values = cast(list[bytes | None], self.transfers.mget(map(self.key, load.hashes)))
        except redis.exceptions.RedisError as exc:
            self._failed("load", exc, tokens=len(load.hashes) * self.layout.block_size)
            values = []
        else:
            self._succeeded()
            loaded = self._write_blocks(load, values)
        tokens = loaded * self.layout.block_size
        with self._lock:
            self.stats.loaded_tokens += tokens
            self.stats.load_seconds.observe(time.perf_counter() - started)
            self._finished.loaded[load.request_id] = tokens
            self._loading.discard(load.request_id)
            self._release_if_done(load.request_id)  # it may have ended while it loaded
        for block_hash in load.hashes[:loaded]:
            self._remember(block_hash)
        self._wake()

    def _write_blocks(self, load: _Load, values: list[bytes | None]) -> int:
        """Copies the leading blocks whose values check out into their cache blocks; how
        many. The first that fails ends the load (a block is only good after its parent):
        a corrupt value is deleted, so that the next save puts a good one back."""
        layout, kv_caches = self.layout, self._kv_caches
        good = 0
        for block_hash, value in zip(load.hashes, values, strict=True):
            reason = check_block(layout, block_hash, value)
            if reason is not None:
                with self._lock:
                    self.stats.fail(reason, (len(values) - good) * layout.block_size)
                if reason != "missing":
                    self._forget(block_hash)
                break
            good += 1
        if not good:
            return 0
        shape = (good, layout.num_layers, *kv_caches[0][:, 0].shape)
        host = torch.empty((good, layout.block_bytes), dtype=torch.uint8,
                           pin_memory=self.device.type == "cuda")  # fmt: skip
        rows = host.numpy()
        for i, value in enumerate(values[:good]):
            assert value is not None
            rows[i] = np.frombuffer(value, dtype=np.uint8, offset=HEADER.size)
        blocks = host.view(kv_caches[0].dtype).view(shape).to(self.device, non_blocking=True)
        ids = torch.tensor(load.block_ids[:good], dtype=torch.long, device=self.device)
        for layer, kv in enumerate(kv_caches):
            kv.index_copy_(1, ids, blocks[:, layer].transpose(0, 1))
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        return good

    def _save(self, save: _Save) -> None:
        """Writes a step's blocks to Redis in one pipeline."""
        started = time.perf_counter()
        if save.ready is not None:
            save.ready.synchronize()
        rows = save.host.numpy()
        try:
            if not self._allowed():
                raise redis.exceptions.ConnectionError("the KV store is skipped (breaker open)")
            pipe = self.transfers.pipeline(transaction=False)
            for block_hash, row in zip(save.hashes, rows, strict=True):
                value = encode_block(self.layout, block_hash, memoryview(row))
                pipe.set(self.key(block_hash), value, ex=self.ttl)
            pipe.execute()
        except redis.exceptions.RedisError as exc:
            tokens = len(save.hashes) * self.layout.block_size
            self._failed("save", exc, tokens=tokens)
            for block_hash in save.hashes:
                self._forget(block_hash, in_store=False)
            with self._lock:
                self._save_failed.update(save.request_ids)
        else:
            self._succeeded()
            with self._lock:
                self.stats.saved_tokens += len(save.hashes) * self.layout.block_size
        with self._lock:
            self.stats.save_seconds.observe(time.perf_counter() - started)
            self._queued_save_bytes -= save.nbytes
            for rid in save.request_ids:
                self._unsaved[rid] -= 1
                if not self._unsaved[rid]:
                    del self._unsaved[rid]
                    self._release_if_done(rid)
        self._wake()

    # Bookkeeping.

    def _release_if_done(self, rid: str) -> None:
        """Releases a finished request once no save or load of it is in flight (the
        caller holds the lock)."""
        if rid in self._held and rid not in self._unsaved and rid not in self._loading:
            self._finished.released.add(rid)
            if rid in self._save_failed:
                self._save_failed.discard(rid)
                self._finished.unsaved.add(rid)

    def _remember(self, block_hash: bytes) -> None:
        with self._lock:
            self._recent[block_hash] = None
            self._recent.move_to_end(block_hash)
            if len(self._recent) > RECENT_SAVES:
                self._recent.popitem(last=False)

    def _forget(self, block_hash: bytes, in_store: bool = True) -> None:
        """A block that is not good in the store: saved again next time; deleted from
        the store (best effort) when a bad value is there."""
        with self._lock:
            self._recent.pop(block_hash, None)
        if in_store:
            with contextlib.suppress(redis.exceptions.RedisError):
                self.transfers.delete(self.key(block_hash))

    def _allowed(self) -> bool:
        with self._lock:
            return self.breaker.allows()

    def _succeeded(self) -> None:
        with self._lock:
            self.breaker.record_success()

    def _failed(self, what: str, exc: redis.exceptions.RedisError, tokens: int = 0) -> None:
        """A call that Redis did not answer: a timeout counts toward opening the breaker;
        a refused connection opens it as fast (a store that is down is skipped too)."""
        reason = "timeout" if isinstance(exc, redis.exceptions.TimeoutError) else "unavailable"
        with self._lock:
            self.breaker.record_timeout()
            self.stats.fail(reason, tokens)
        log.debug("KV store %s failed: %r", what, exc)

"""The KV connector seam: how KV blocks come into this engine from outside and go out of
it (another engine server's prefill, a store that outlives this process). The shape of
vLLM V1's KVConnectorBase_V1, as one object: this engine's scheduler and runner share a
process, so the connector's two halves share it too.

The scheduler side, called by engine/scheduler.py:
- `get_num_new_matched_tokens`: how many prompt tokens past the local prefix-cache hit
  can be loaded from outside, and whether the load is asynchronous. The scheduler then
  allocates blocks for them and calls `update_state_after_alloc`. The request waits,
  parked apart from the queue, until `get_finished` says its load is done (a synchronous
  load is done within `start_load_kv`): it is never scheduled half loaded, and it holds
  up nobody else.
- `request_finished`: the request ended (after its last forward, or aborted); its last
  full blocks are saved now. True keeps its blocks (and, when it returns
  kv_transfer_params, its answer) until `get_finished` releases it: a save still reads
  them, and a prefill server's answer is only good once its KV is saved.

The runner side, called by engine/llm_engine.py around the runner's step:
- `register_kv_caches`: once, the cache tensors that loads write and saves read.
- `start_load_kv`: starts the loads the scheduler asked for, before the forward that
  would need those blocks (a parked request is in no forward until its load is done).
- `save_kv`: after the forward, saves the full blocks of the step's running requests
  that are not saved yet.
- `get_finished`: loads done (how many tokens each loaded: a load that failed part way
  loaded fewer, and the rest is computed) and requests released.

Failure costs time, never a wrong token: a connector loads a block only when it can
prove the block is the one asked for (engine/kv_block_codec.py), and counts the rest as
not loaded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.metrics import KVTransferStats
from engine.sequence import Sequence


@dataclass
class KVFinished:
    """What the connector finished since it was last asked."""

    loaded: dict[str, int] = field(default_factory=dict)  # request id -> tokens loaded
    released: set[str] = field(default_factory=set)  # requests whose blocks it let go
    # Of those, the ones whose saves failed: what their kv_transfer_params named is not
    # in the store, so they answer none (the next server computes the prompt itself).
    unsaved: set[str] = field(default_factory=set)


class KVConnector(ABC):
    stats: KVTransferStats  # its counters, read with the engine's (EngineStats.kv_transfer)

    @abstractmethod
    def get_num_new_matched_tokens(
        self, seq: Sequence, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """Tokens of seq's prompt past `num_computed_tokens` (the local hit, whole blocks)
        that can be loaded, a whole number of blocks short of the prompt's last token
        (which is computed for its logits); and whether the load is asynchronous."""

    @abstractmethod
    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        """seq's blocks for its local hit and the `num_external_tokens` after it are
        allocated (seq.block_table): the load is queued for `start_load_kv`."""

    @abstractmethod
    def request_finished(self, seq: Sequence) -> tuple[bool, dict[str, Any] | None]:
        """seq ended (its blocks still in seq.block_table): whether to keep them until
        `get_finished` releases it, and what to tell the next server (vLLM's
        kv_transfer_params; when given, the request's answer waits for the release)."""

    @abstractmethod
    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        """The runner's cache tensors, each layer's, which loads write and saves read."""

    @abstractmethod
    def start_load_kv(self) -> None:
        """Starts the queued loads into their blocks."""

    @abstractmethod
    def save_kv(self, seqs: Seq[Sequence]) -> None:
        """After a step's forward: saves the full blocks of seqs (the step's running
        requests; a finished one's last blocks are `request_finished`'s) that are not
        saved yet. Never waits for the store."""

    @abstractmethod
    def get_finished(self) -> KVFinished:
        """The loads and releases done since the last call."""

    @abstractmethod
    def pending(self) -> bool:
        """Whether a load or a save is still under way."""

    @abstractmethod
    def on_progress(self, wake: Callable[[], None]) -> None:
        """`wake` is called (from any thread) when a load or a save is done, so that a
        step loop with nothing else to do can sleep until then."""

    @abstractmethod
    def close(self) -> None:
        """Stops the connector's threads (saves in flight are given a moment to finish)."""

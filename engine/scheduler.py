"""One scheduler, one token budget per step; no separate prefill and decode phases.

The scheduler owns every sequence's progress and blocks: `schedule` admits,
allocates and preempts before a step; `update` applies the step's new tokens
after it (appends, stops, advances what is computed, trims and names blocks).

Each step serves running decodes first (one token each, plus the speculative
tokens proposed for it), then prefill chunks of partially prefilled and waiting
requests, until the budget or the sequence
limit is reached. When KV blocks run out, the latest-arrived running request is
preempted by recompute: its blocks are freed and it waits again at the front.
The scheduler knows nothing of tensors.

With a KV connector (engine/kv_connector.py), a waiting request whose prompt can be
loaded past its local prefix hit gets its blocks and is parked (LOADING) until the load
is done, taking no budget; then it runs, computing what was not loaded. A finished
request whose connector still reads its blocks is held until it is released.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from engine.kv_cache import BlockManager
from engine.kv_connector import KVConnector
from engine.sequence import Sequence, Status


class ScheduledSequence(NamedTuple):  # a tuple: 64 are made every decode step
    seq: Sequence
    num_new_tokens: int  # query tokens this step, spec_token_ids included
    spec_token_ids: tuple[int, ...]  # proposed tokens to verify after the last one
    # Whether this step computes the sequence's last token, so it gets a new one.
    samples: bool

    @classmethod
    def of(
        cls, seq: Sequence, num_new_tokens: int, spec_token_ids: tuple[int, ...] = ()
    ) -> ScheduledSequence:
        num_real = num_new_tokens - len(spec_token_ids)
        samples = seq.num_computed_tokens + num_real == len(seq.token_ids)
        return cls(seq, num_new_tokens, spec_token_ids, samples)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        eos_token_ids: Iterable[int],
        max_model_len: int,
        kv_connector: KVConnector | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.kv_connector = kv_connector
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: dict[str, Sequence] = {}  # parked while the connector loads their KV
        self.held: dict[str, Sequence] = {}  # finished, blocks kept for the connector
        self.num_preemptions = 0
        # Prompt tokens of admitted requests, and how many of them the prefix cache served.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_generated_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.loading or self.held)

    def finish_transfers(self) -> list[Sequence]:
        """Takes in what the connector finished: loaded requests run (with what their
        load brought counted computed), released ones give back their blocks. The
        released, for the engine to answer those whose answer waited."""
        if self.kv_connector is None:
            return []
        done = self.kv_connector.get_finished()
        for rid, num_loaded in done.loaded.items():
            seq = self.loading.pop(rid, None)
            if seq is None:  # it ended while it loaded: released below
                continue
            seq.num_computed_tokens += num_loaded
            seq.metrics.num_cached_tokens += num_loaded
            seq.metrics.num_loaded_tokens += num_loaded
            # Blocks the load did not fill are computed: trimmed, the run allocates them.
            self.block_manager.trim(seq, seq.num_computed_tokens)
            self.block_manager.cache_full_blocks(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
        released = [self.held.pop(rid) for rid in done.released if rid in self.held]
        for seq in released:
            self.block_manager.free_sequence(seq)
            if seq.request_id in done.unsaved:
                seq.kv_transfer_params = None
        return released

    def schedule(self) -> list[ScheduledSequence]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        preempted = False
        running, block_size = Status.RUNNING, self.block_manager.block_size
        # The budget goes to decodes first (one new token), then speculating decodes,
        # then partial prefills: running streams never wait behind a long prompt.
        decodes: list[Sequence] = []
        speculating: list[Sequence] = []
        partial: list[Sequence] = []
        partial_speculating: list[Sequence] = []
        for seq in self.running:
            if len(seq.token_ids) - seq.num_computed_tokens > 1:
                (partial_speculating if seq.spec_token_ids else partial).append(seq)
            else:
                (speculating if seq.spec_token_ids else decodes).append(seq)
        for seq in decodes + speculating + partial + partial_speculating:
            if budget == 0:
                break
            if seq.status is not running:  # preempted earlier in this loop
                continue
            computed = seq.num_computed_tokens
            if (
                computed + 1 == len(seq.token_ids)
                and not seq.spec_token_ids
                and computed < len(seq.block_table) * block_size
            ):
                # A decode whose last block has room, most steps' every sequence: nothing
                # to allocate, and a tuple made without NamedTuple's Python-level __new__.
                scheduled.append(tuple.__new__(ScheduledSequence, (seq, 1, (), True)))
                budget -= 1
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if num_new < seq.num_uncomputed_tokens and not self.enable_chunked_prefill:
                continue
            # Proposals (made for decodes only) ride as far as the budget reaches.
            spec = tuple(seq.spec_token_ids[: budget - 1])
            if spec and not self.block_manager.allocate(
                seq, seq.num_computed_tokens + num_new + len(spec)
            ):
                spec = ()  # never preempt anyone for a guess
            num_new += len(spec)
            while not self.block_manager.allocate(seq, seq.num_computed_tokens + num_new):
                preempted = True
                victim = next(
                    (s for s in reversed(self.running) if all(x.seq is not s for x in scheduled)),
                )
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSequence.of(seq, num_new, spec))
                budget -= num_new
        # Admitted prompts the budget did not reach this step wait behind other work.
        if len(scheduled) < len(self.running):
            served = {id(item.seq) for item in scheduled}
            for seq in self.running:
                if not seq.metrics.token_times and id(seq) not in served:
                    seq.metrics.num_prefill_steps_waited += 1
        # New requests only when nothing had to be preempted for the running ones.
        while (
            self.waiting
            and budget > 0
            and len(self.running) + len(self.loading) < self.max_num_seqs
            and not preempted
        ):
            seq = self.waiting[0]
            cached_ids, cached_hashes = self.block_manager.find_cached_prefix(seq)
            num_cached = len(cached_ids) * self.block_manager.block_size
            if self.kv_connector is not None:
                num_external, _ = self.kv_connector.get_num_new_matched_tokens(seq, num_cached)
                if num_external:
                    if not self._park(seq, cached_ids, cached_hashes, num_cached, num_external):
                        break
                    continue
            remaining = seq.num_tokens - num_cached
            num_new = min(remaining, budget)
            if num_new < remaining and not self.enable_chunked_prefill:
                break
            if not self.block_manager.allocate(
                seq, num_cached + num_new, cached_ids, cached_hashes
            ):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            seq.num_computed_tokens = num_cached
            self._admitted(seq, num_cached)
            self.running.append(seq)
            scheduled.append(ScheduledSequence.of(seq, num_new))
            budget -= num_new
        return scheduled

    def _park(
        self,
        seq: Sequence,
        cached_ids: list[int],
        cached_hashes: list[bytes],
        num_cached: int,
        num_external: int,
    ) -> bool:
        """Gives seq blocks for its local hit and what it will load, and parks it until
        the load is done (the connector's loads are all waited for this way: a
        synchronous one is done when the next step asks); False if blocks run out."""
        assert self.kv_connector is not None
        if not self.block_manager.allocate(
            seq, num_cached + num_external, cached_ids, cached_hashes
        ):
            return False
        self.waiting.popleft()
        seq.status = Status.LOADING
        seq.num_computed_tokens = num_cached
        self._admitted(seq, num_cached)
        self.loading[seq.request_id] = seq
        self.kv_connector.update_state_after_alloc(seq, num_external)
        return True

    def _admitted(self, seq: Sequence, num_cached: int) -> None:
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += num_cached
        if seq.metrics.first_scheduled_time is None:
            seq.metrics.first_scheduled_time = time.perf_counter()
            seq.metrics.num_cached_tokens = num_cached

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_sequence(seq)
        seq.status = Status.WAITING
        seq.metrics.num_preempted_tokens += seq.num_computed_tokens
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(
        self, scheduled: list[ScheduledSequence], new_tokens: list[list[int]]
    ) -> list[tuple[Sequence, int]]:
        """Applies a step's results: new_tokens holds, in order, the tokens of each
        scheduled sequence that sampled (see ScheduledSequence.samples). Returns those
        sequences, finished ones included (stopped, or out of length), each with the
        number of tokens it kept."""
        now = time.perf_counter()
        tokens_of = iter(new_tokens)
        sampled: list[tuple[Sequence, int]] = []
        block_manager = self.block_manager
        # Whether naming full blocks can have work: a call a sequence saved otherwise.
        caching, block_size = block_manager.enable_prefix_caching, block_manager.block_size
        generated = 0
        for seq, num_new, spec, samples in scheduled:
            if not seq.metrics.token_times:
                seq.metrics.num_prefill_chunks += 1
            if not samples:
                seq.num_computed_tokens += num_new
                block_manager.cache_full_blocks(seq)
                continue
            before = len(seq.token_ids)
            finish = self._append_tokens(seq, next(tokens_of), now)  # may stop inside the run
            appended = len(seq.token_ids) - before
            sampled.append((seq, appended))
            generated += appended
            # KV stays valid for this step's real inputs and the kept proposals: every
            # appended token but the newest. Slots past that (rejected proposals) are
            # rewritten later, or given back by the trim.
            seq.num_computed_tokens += num_new - len(spec) + appended - 1
            if finish is not None:
                self.finish(seq, finish)
                continue
            if spec:  # blocks held for proposals; a decode's fit its tokens exactly
                block_manager.trim(seq, len(seq.token_ids))
            if caching and len(seq.block_hashes) < seq.num_computed_tokens // block_size:
                block_manager.cache_full_blocks(seq)
        self.num_generated_tokens += generated
        return sampled

    def _append_tokens(self, seq: Sequence, tokens: list[int], now: float) -> str | None:
        """Appends tokens in order until one of them ends the request; returns the finish
        reason (None: the request goes on). Stop strings are the front end's
        (engine/output_processor.py)."""
        params, token_ids, times = seq.params, seq.token_ids, seq.metrics.token_times
        # Out of length at max_tokens outputs or at the context length, whichever is first.
        limit = min(seq.num_prompt_tokens + params.max_tokens, self.max_model_len)
        stops = () if params.ignore_eos else self.eos_token_ids
        for token in tokens:
            token_ids.append(token)
            times.append(now)
            if token in stops:
                return "stop"
            if len(token_ids) >= limit:
                return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Ends a request (stop, length or abort): names its full blocks for later
        requests, then frees them at once, unless the connector keeps them (it is told
        of every end; what it answers for the next server replaces the request's
        kv_transfer_params)."""
        self.block_manager.cache_full_blocks(seq)
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status is Status.LOADING:
            del self.loading[seq.request_id]
        keep = False
        if self.kv_connector is not None:
            keep, seq.kv_transfer_params = self.kv_connector.request_finished(seq)
        if keep:
            self.held[seq.request_id] = seq
        else:
            self.block_manager.free_sequence(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.metrics.finished_time = time.perf_counter()


def computed_and_prefill(scheduled: list[ScheduledSequence]) -> tuple[int, int]:
    """A step's tokens computed, and of them prompt (or a preempted request's recomputed)
    ones: all of an item's real query tokens unless it is one decode (plus proposals) of
    a request that has had its first token. Read before the update advances them."""
    num_computed = num_prefill = 0
    for seq, num_new, spec_ids, _ in scheduled:
        num_computed += num_new
        num_real = num_new - len(spec_ids)
        if num_real != 1 or not seq.metrics.token_times:
            num_prefill += num_real
    return num_computed, num_prefill

"""The scheduler of async scheduling (engine/async_step.py): it runs one step ahead of
the outputs, with placeholders for the tokens not sampled yet.

Once a step is launched, `advance` counts its tokens computed and appends a placeholder
for each token it will sample: -1 - j for the step's j-th sampling sequence, which the
runner reads from that step's sampled-token tensor when the next step takes it as
input (engine/model_runner.py). So the next `schedule` sees every sequence as the
synchronous scheduler would after the step's update: a decode's new token to compute,
its blocks to allocate. `resolve` then puts each sampled token in its placeholder's
place, and stops requests as the synchronous `update` does.

The engine calls them in this order, one step (N + 1) in flight at a time:
schedule(N + 1), launch(N + 1), resolve(N), advance(N + 1). Resolve before advance
keeps the state between steps the synchronous state plus the step in flight: a sequence
holds at most one placeholder, its last token, and a request that finishes in
resolve(N) finishes exactly as it would synchronously (its step N + 1, already
launched, is discarded: advance skips it, and resolve(N + 1) drops its token). An abort
between steps first takes back what advance counted for the step in flight.

Prefix blocks are named in advance, not in resolve: at each schedule the prefix cache
names the blocks the synchronous scheduler's would. A named block whose KV the step in
flight still writes is read only by later steps, which run after it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Items

from engine.scheduler import ScheduledSequence, Scheduler
from engine.sequence import Sequence, Status


class AsyncScheduler(Scheduler):
    # The step in flight as advance counted it (an abort takes its part back); replaced
    # whole, never changed in place.
    ahead: Items[ScheduledSequence] = ()
    # Requests whose placeholder is their last token by length: they end when the step
    # in flight does, so the next step leaves them out rather than compute a token that
    # would be dropped (vLLM's async scheduler does the same).
    ending: Items[Sequence] = ()

    def schedule(self) -> list[ScheduledSequence]:
        ending = [seq for seq in self.ending if seq.status is Status.RUNNING]
        if not ending:
            return super().schedule()
        left_out = set(map(id, ending))
        self.running = [seq for seq in self.running if id(seq) not in left_out]
        try:
            return super().schedule()
        finally:  # back at the end: resolve ends them before the next schedule
            self.running += ending

    def advance(self, scheduled: list[ScheduledSequence]) -> None:
        """Counts a launched step's tokens computed and gives each token it samples a
        placeholder; a request that finished since it was scheduled is left alone."""
        self.ahead = scheduled
        block_manager, running = self.block_manager, Status.RUNNING
        caching, block_size = block_manager.enable_prefix_caching, block_manager.block_size
        max_model_len = self.max_model_len
        ending = []
        j = 0  # the step's sampling sequences so far
        for seq, num_new, _, samples in scheduled:
            if seq.status is running:
                seq.num_computed_tokens += num_new
                if samples:
                    tokens = seq.token_ids
                    tokens.append(-1 - j)
                    limit = seq.num_prompt_tokens + seq.params.max_tokens
                    if len(tokens) >= limit or len(tokens) >= max_model_len:
                        ending.append(seq)
                if caching and len(seq.block_hashes) < seq.num_computed_tokens // block_size:
                    block_manager.cache_full_blocks(seq)
            j += samples
        self.ending = ending

    def resolve(
        self, scheduled: list[ScheduledSequence], tokens: list[int]
    ) -> list[tuple[Sequence, int]]:
        """Puts a step's sampled tokens (one a sampling sequence, in order) in their
        placeholders' places and stops requests as Scheduler.update does; what it
        returns. The tokens of requests that finished (or were aborted) while the step
        ran are dropped."""
        self.ahead = ()  # what advance counted for this step is real now
        now = time.perf_counter()
        tokens_of = iter(tokens)
        sampled: list[tuple[Sequence, int]] = []
        finished = Status.FINISHED
        for seq, _, _, samples in scheduled:
            token = next(tokens_of) if samples else None
            if seq.status is finished:
                continue
            if not seq.metrics.token_times:
                seq.metrics.num_prefill_chunks += 1
            if token is None:
                continue
            seq.token_ids.pop()  # its placeholder
            reason = self._append_tokens(seq, [token], now)
            sampled.append((seq, 1))
            if reason is not None:
                self.finish(seq, reason)
        self.num_generated_tokens += len(sampled)
        return sampled

    def finish(self, seq: Sequence, reason: str) -> None:
        """Scheduler.finish, after taking back what advance counted for the step in
        flight (an abort between steps), names included: its blocks are named as
        synchronously."""
        item = next((item for item in self.ahead if item.seq is seq), None)
        if item is not None and seq.status is Status.RUNNING:
            seq.num_computed_tokens -= item.num_new_tokens
            if item.samples:
                seq.token_ids.pop()
            self.block_manager.forget_hashes(seq)
        super().finish(seq, reason)

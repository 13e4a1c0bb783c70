"""Per-request timings and engine-wide counters."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from engine.step_window import StepWindowStats


@dataclass
class RequestMetrics:
    """Where one request's time went: timestamps (time.perf_counter, the same clock in
    every process) and what the engine did for it. Phases as vLLM's request metrics:
    queued (arrival -> first scheduled), prefill (first scheduled -> first token),
    decode (first token -> last token)."""

    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache or the KV store
    num_loaded_tokens: int = 0  # of which loaded from the KV store (engine/kv_connector.py)
    num_preemptions: int = 0
    num_preempted_tokens: int = 0  # computed tokens whose KV preemptions dropped
    # Before its first token: steps that computed a chunk of its prompt, and steps
    # that gave it nothing because the token budget went to other requests.
    num_prefill_chunks: int = 0
    num_prefill_steps_waited: int = 0
    spec_draft_tokens: int = 0  # tokens proposed for it
    spec_accepted_tokens: int = 0  # of which kept

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Time to first token, in seconds."""
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def prefill_time(self) -> float | None:
        """First scheduled to first token: its own chunks and the steps it waited."""
        if self.first_scheduled_time is None or not self.token_times:
            return None
        return self.token_times[0] - self.first_scheduled_time

    @property
    def decode_time(self) -> float | None:
        """First token to last token."""
        return self.token_times[-1] - self.token_times[0] if self.token_times else None

    @property
    def inference_time(self) -> float | None:
        """Prefill plus decode: first scheduled to last token."""
        if self.first_scheduled_time is None or not self.token_times:
            return None
        return self.token_times[-1] - self.first_scheduled_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies, in seconds."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def e2e(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


# Seconds a KV store load or save of one request's blocks took (the histograms' bounds):
# a round trip on one host is under a millisecond, 90 MB of a 4,000-token prompt tens.
KV_TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class TimeHistogram:
    """Observations in seconds, counted per bucket of KV_TRANSFER_BUCKETS (the last count:
    above them all), as Prometheus histograms are exported."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(KV_TRANSFER_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        i = next((i for i, b in enumerate(KV_TRANSFER_BUCKETS) if seconds <= b), -1)
        self.counts[i] += 1
        self.total += seconds


@dataclass
class KVTransferStats:
    """A KV connector's counters (engine/kv_connector.py): tokens whose KV went to or came
    from the store, failures by reason (the tokens were computed instead, or not saved),
    and how long loads and saves took."""

    saved_tokens: int = 0
    loaded_tokens: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    load_seconds: TimeHistogram = field(default_factory=TimeHistogram)
    save_seconds: TimeHistogram = field(default_factory=TimeHistogram)

    def fail(self, reason: str, count: int = 1) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + count


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found cached
    num_preemptions: int = 0
    computed_tokens: int = 0  # tokens forwarded through the model
    generation_tokens: int = 0
    # Speculative decoding (vLLM's spec_decode counters).
    spec_method: str | None = None
    spec_num_drafts: int = 0  # verifications of at least one proposed token
    spec_draft_tokens: int = 0  # tokens proposed
    spec_accepted_tokens: int = 0  # of which kept
    kv_transfer: KVTransferStats | None = None  # with a KV store (engine/kv_connector.py)
    steps: StepWindowStats = field(default_factory=lambda: StepWindowStats(0.0))

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Of the prompt tokens looked up in the prefix cache, the share found there."""
        if not self.prefix_cache_queries:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def spec_acceptance_rate(self) -> float | None:
        if not self.spec_draft_tokens:
            return None
        return self.spec_accepted_tokens / self.spec_draft_tokens

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens a speculating sequence gets per step: accepted drafts plus the target's."""
        if not self.spec_num_drafts:
            return None
        return 1 + self.spec_accepted_tokens / self.spec_num_drafts

"""What one request of a load test measured."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

CACHE_STATUSES = frozenset({"Hit", "Miss", "Bypass"})


@dataclass
class RequestRecord:
    """Times are seconds; `*_at` times count from the start of the run, the rest from the
    moment the request was sent. A request counts as completed when `error` is None."""

    index: int
    kind: str  # the workload item's kind: "sharegpt", "rag" or "repeat"
    long: bool  # a long (rag) prompt
    max_tokens: int
    ignore_eos: bool
    sent_at: float = 0.0
    status_code: int | None = None
    cache_status: str | None = None  # the X-Cache-Status header, if the server sends one
    ttft: float | None = None  # to the first chunk with content
    itl: list[float] = field(default_factory=list)  # gaps between content chunks
    e2e: float | None = None
    prompt_tokens: int | None = None  # from the usage chunk
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # kind: "http_429", "timeout", "connect", "stream_error", ...
    error_code: str | None = None  # the OpenAI error code, where the server gave one
    error_message: str | None = None
    # Milliseconds by phase name (cache, embed, queue, prefill, decode, ...), as the server
    # reported them: the final chunk's `timings`, else the Server-Timing header; None when
    # it reported neither.
    timings: dict[str, float] | None = None
    # A hit's X-Cache-Saved-Seconds: how long its answer took to generate when it was
    # stored (None on a hit whose entry has no time, and on anything but a hit).
    saved_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e is not None

    @property
    def finished_at(self) -> float | None:
        return None if self.e2e is None else self.sent_at + self.e2e

    def chunk_times(self) -> list[float]:
        """Arrival of every content chunk, from the start of the run."""
        if self.ttft is None:
            return []
        return list(itertools.accumulate(self.itl, initial=self.sent_at + self.ttft))

"""What the engine hands back for a request: the core's new tokens each step, and the
output a caller sees (engine/output_processor.py makes one from the other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from engine.metrics import RequestMetrics


class CoreOutput(NamedTuple):
    """One request's progress in one step of the engine core: only what is new, so a
    step's report stays small however long its requests have run."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" (an EOS token), "length" or "abort" once finished
    time: float  # when the step appended them (time.perf_counter)
    # The request's counters and timestamps (token_times left out): with its first
    # tokens and when it finishes, None in between.
    metrics: RequestMetrics | None
    # When it finishes: what its KV connector tells the next server (vLLM's P/D protocol).
    kv_transfer_params: dict[str, Any] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    # Every output token so far: the request's own list, which grows as it runs (copy it
    # to keep a snapshot of a stream's earlier output).
    token_ids: list[int]
    # Output text so far, stop strings excluded. While streaming it may end in a tail
    # that is not handed out yet (delta_text) because it could still become a stop string.
    text: str
    delta_token_ids: list[int]  # new since the previous output of this request
    delta_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" once finished
    stop_reason: str | None  # the stop string that ended it, if one did
    metrics: RequestMetrics
    # Once finished: what the KV connector says for a decode server (vLLM's P/D protocol).
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def num_cached_tokens(self) -> int:
        return self.metrics.num_cached_tokens

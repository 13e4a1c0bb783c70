"""What the engine hands back for a request: a delta per step, the whole so far."""

from __future__ import annotations

from dataclasses import dataclass

from engine.metrics import RequestMetrics


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every output token so far
    # Output text so far, stop strings excluded. AsyncLLM's is the text handed out so far:
    # while streaming it lacks a tail that may still become a stop string.
    text: str
    delta_token_ids: list[int]  # new since the previous output of this request
    delta_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" once finished
    stop_reason: str | None  # the stop string that ended it, if one did
    metrics: RequestMetrics

    @property
    def num_cached_tokens(self) -> int:
        return self.metrics.num_cached_tokens

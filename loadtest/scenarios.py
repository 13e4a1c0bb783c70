"""Scenarios: two server configurations compared on the same workload and offered load.

The first side is the feature on, the second the baseline; the headline is the baseline's
value over the feature's (how many times lower the feature makes it), and the goal, where
there is one, is a least ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Side:
    label: str
    serve_args: tuple[str, ...] = ()
    cache: bool = False  # the semantic cache on (with its own fresh Redis), else --no-cache


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    sides: tuple[Side, Side]
    workload: str
    num_requests: int
    rate: float | None = None
    concurrency: int | None = None
    options: dict[str, Any] = field(default_factory=dict)  # WorkloadOptions fields
    headline: tuple[str, ...] = ("e2e", "p50_ms")  # path into a run's summary
    headline_name: str = "median end-to-end latency"
    goal: float | None = None


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            name="chunked-prefill",
            about="Long rag prompts arrive among ShareGPT chat streams: with chunked prefill "
            "a long prompt is prefilled a chunk per step between the streams' decodes; "
            "without it, its whole prefill runs in one step and every running stream waits. "
            "The headline takes the chat streams' gaps that overlap a long prompt's wait for "
            "its first token, where a prefill can stall them: over whole streams those few "
            "gaps can hide below p99 (the overall ITL row).",
            sides=(Side("chunked prefill"), Side("no chunked prefill", ("--no-chunked-prefill",))),
            workload="mixed",
            num_requests=32,
            rate=0.25,  # below saturation: a saturated server queues, and both sides stall
            options={
                "long_fraction": 0.4,  # at 0.25 the stalls were ~1% of gaps: at the edge of p99
                "rag_tokens": (1000, 2000),
                "max_prompt_tokens": 512,
                "max_output_tokens": 64,
            },
            headline=("itl_during_long_prefill", "p99_ms"),
            headline_name="p99 ITL of the chat streams while a long prompt is prefilled",
            goal=3.0,
        ),
        Scenario(
            name="spec",
            about="ShareGPT chat with n-gram speculative decoding (prompt lookup, up to 8 "
            "tokens proposed a step, fewer where they do not pay) against plain decoding.",
            sides=(
                Side("ngram spec", ("--spec-method", "ngram")),
                Side("no spec"),
            ),
            workload="sharegpt",
            num_requests=24,
            rate=0.5,
        ),
        Scenario(
            name="cache",
            about="Questions asked again in other words (the repeat workload) through the "
            "gateway with its semantic cache on, against the same gateway with --no-cache.",
            sides=(Side("cache on", cache=True), Side("cache off")),
            workload="repeat",
            num_requests=60,
            rate=1.0,
            goal=10.0,
        ),
        Scenario(
            name="prefix-cache",
            about="Rag questions over two shared long contexts, one at a time: with prefix "
            "caching a context's KV blocks are computed once and reused by later questions.",
            sides=(Side("prefix caching"), Side("no prefix caching", ("--no-prefix-caching",))),
            workload="rag",
            num_requests=12,
            concurrency=1,
            options={"rag_contexts": 2, "rag_tokens": (2000, 3000), "max_output_tokens": 32},
            headline=("ttft", "p50_ms"),
            headline_name="median time to first token",
        ),
    )
}

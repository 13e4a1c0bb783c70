"""Scenarios: two server configurations compared on the same workload and offered load.

The first side is the feature on, the second the baseline; the headline is the baseline's
value over the feature's (how many times lower the feature makes it), and the goal, where
there is one, is a least ratio. A side is one `semgate serve`, or a gateway (cache off)
in front of engine servers of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Side:
    label: str
    serve_args: tuple[str, ...] = ()
    cache: bool = False  # the semantic cache on (with its own fresh Redis), else --no-cache
    # Engine servers (`semgate serve --no-cache`, the scenario's engine_args) that this
    # side's server forwards to as one upstream group; 0: it runs the engine itself.
    engines: int = 0


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
    engine_args: tuple[str, ...] = ()  # of the sides' engine servers
    # The most a side's busiest engine server may take of its requests, where that is a goal.
    max_server_share: float | None = None
    then: str | None = None  # the scenario the same command runs next


# The routing scenarios: two engine servers a side, each with KV room for 3,700 tokens
# (231 blocks of 16 at 23,040 bytes a token, bfloat16): six contexts of about 1,000
# tokens (6,000 in all) exceed one server; a server's share of three fits, with room for
# the requests' own questions and answers.
ROUTED_ENGINES = 2
ROUTED_ENGINE_ARGS = ("--kv-cache-memory", str(231 * 16 * 23_040), "--max-model-len", "1536")
# The gateway remembers as much of each server's prompts as its KV cache holds.
ROUTED_PREFIX = ("--upstream-policy", "prefix", "--upstream-prefix-capacity", "3700")
ROUTED_RAG = {
    "rag_contexts": 6,
    "rag_tokens": (900, 1100),
    "rag_hot_fraction": 1 / 6,  # drawn evenly at random: in turn would align with turns
    "max_output_tokens": 32,
}

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
        Scenario(
            name="routing",
            about="Rag questions over shared contexts through a gateway in front of two "
            "engine servers, sized as production is: all the contexts together exceed one "
            "server's KV cache, each server's share fits. Prefix routing keeps each "
            "context on the server that prefilled it; round robin sends every context to "
            "every server, which evicts and prefills them again.",
            sides=(
                Side("prefix", ROUTED_PREFIX, engines=ROUTED_ENGINES),
                Side("round robin", ("--upstream-policy", "round_robin"), engines=ROUTED_ENGINES),
            ),
            workload="rag",
            num_requests=80,
            rate=0.8,
            options=ROUTED_RAG,
            engine_args=ROUTED_ENGINE_ARGS,
            headline=("ttft", "p50_ms"),
            headline_name="median time to first token",
            goal=3.0,
            then="routing-skewed",
        ),
        Scenario(
            name="routing-skewed",
            about="The routing scenario's servers with 80% of the questions on one hot "
            "context: prefix routing sends it to its server until that one's load exceeds "
            "the other's by the balance threshold, then to the other (which then holds it "
            "too); least-load routing spreads every request by load alone.",
            sides=(
                Side("prefix", ROUTED_PREFIX, engines=ROUTED_ENGINES),
                Side("least load", ("--upstream-policy", "least_load"), engines=ROUTED_ENGINES),
            ),
            workload="rag",
            num_requests=80,
            rate=0.8,
            options={**ROUTED_RAG, "rag_hot_fraction": 0.8},
            engine_args=ROUTED_ENGINE_ARGS,
            headline=("ttft", "p99_ms"),
            headline_name="p99 time to first token",
            goal=1 / 1.2,  # prefix no worse than least load by more than 20%
            max_server_share=0.6,
        ),
    )
}

"""The pd scenario (issue 49): two engine servers behind a gateway, colocated (each
prefills and decodes its own requests, prefix routing between them) against prefill and
decode apart (one server prefills the long prompts into a KV store in Redis, the other
loads them and decodes), swept over request rates and judged by SLO attainment and
goodput (loadtest/slo.py).

The colocated servers run without a KV store: every prompt of this workload is its own
(each rag prompt has a context of its own, each chat its own question), so a shared store
would hold nothing another request reuses and would only cost its saves; the baseline is
the pair one runs without P/D. Give their Engine `kv_store=True` to measure it with one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadtest.slo import Slo

ABOUT = (
    "A mixed workload (long rag prompts among short ShareGPT chats) through a gateway in "
    "front of two engine servers of one thread each, at a sweep of Poisson request rates. "
    "Colocated, each server prefills and decodes its own requests, so a long prompt's "
    "prefill chunks share the steps of the chat streams running beside it; with prefill and "
    "decode apart, the long prompts are prefilled on one server into a KV store in Redis "
    "and decoded on the other, which loads their KV instead of computing it. Colocated runs "
    "without a KV store: no prompt of this workload is another's prefix, so a store would "
    "only cost its saves."
)
# The gateway's prefill rule: a prompt with more uncached tokens than this goes to the
# prefill server. Between this workload's chats (at most max_prompt_tokens of question,
# plus the chat template) and its rag prompts (at least rag_tokens[0]), so that exactly
# the long prompts are prefilled apart.
PD_MIN_PROMPT_TOKENS = 1024
# The prefill server's queue the gateway accepts before it prefills a long prompt on the
# decode server instead. The gateway's default (2) protects TTFT; this scenario is judged
# by ITL as much, and a long prefill on the decode server stalls every stream there (the
# first run's 3 such prompts at 0.6 req/s), so a long prompt waits for the prefill server.
PD_MAX_PREFILL_QUEUE = 4
# Rates swept, requests per second. On this 2-core machine one engine thread prefills a
# 3,000-token prompt in about 8 s (docs/loadtest/prefix-cache), so with a quarter of long
# prompts a single prefill server saturates near 0.5 req/s and the colocated pair near 1;
# the colocated chat streams meet the long prompts' prefill chunks well below that.
DEFAULT_RATES = (0.1, 0.2, 0.3, 0.4, 0.5)
REQUESTS_PER_RATE = 28  # seven long prompts a rate
# SLOs, set from a first run (0.15-0.6 req/s, 20 requests a rate: docs/loadtest/pd): the
# colocated chats' per-request mean ITL had a p90 of 44-58 ms at every rate (a decode step
# that carries a 64-token chunk of a long prompt takes 100-150 ms, one beside long
# contexts about 36 ms), the P/D decode server's 27-36 ms below its saturation; 40 ms
# tells them apart. TTFT: a long prompt's prefill on one thread (about 8 s for 3,000
# tokens) with room for one more queued before it.
DEFAULT_SLO = Slo(ttft_ms=20_000, itl_ms=40)
# A mixed workload: a quarter long rag prompts, the rest short ShareGPT chats, short
# answers (WorkloadOptions fields).
PD_OPTIONS: dict[str, Any] = {
    "long_fraction": 0.25,
    "rag_tokens": (2000, 4000),
    "max_prompt_tokens": 256,
    "max_output_tokens": 64,
}
# Redis holds the KV of the prompts between their save and their load: about 23 KB a
# token for SmolLM2-135M in bfloat16, 90 MB for a 4,000-token prompt; this much leaves
# room for a queue of them. Least recently used keys go first.
STORE_MAXMEMORY = "2gb"


@dataclass(frozen=True)
class Engine:
    """One engine server of a side: `semgate serve --no-cache` in this role."""

    role: str = "both"  # --kv-role: prefill, decode, or both (the default, not passed)
    kv_store: bool = False  # --kv-store on the side's Redis

    @property
    def prefill(self) -> bool:
        """One of the gateway's --upstream-prefill servers, else of its --upstream ones."""
        return self.role == "prefill"

    def args(self) -> list[str]:
        return [] if self.role == "both" else ["--kv-role", self.role]

    @property
    def name(self) -> str:
        """Its placeholder in the report's command lines, numbered there."""
        return "ENGINE" if self.role == "both" else self.role.upper()


@dataclass(frozen=True)
class PdSide:
    label: str
    engines: tuple[Engine, ...]
    gateway_args: tuple[str, ...] = ()  # the gateway's flags beyond its upstreams

    @property
    def kv_store(self) -> bool:
        return any(engine.kv_store for engine in self.engines)

    def names(self) -> list[str]:
        """The engine servers' names in the report, in order: ENGINE1, ENGINE2; PREFILL1,
        DECODE1."""
        kinds = [engine.name for engine in self.engines]
        return [f"{kind}{kinds[: i + 1].count(kind)}" for i, kind in enumerate(kinds)]


PD_SIDES = (
    PdSide(
        "P/D",
        engines=(
            Engine("prefill", kv_store=True),
            Engine("decode", kv_store=True),
        ),
        gateway_args=(
            "--pd-min-prompt-tokens",
            str(PD_MIN_PROMPT_TOKENS),
            "--pd-max-prefill-queue",
            str(PD_MAX_PREFILL_QUEUE),
        ),
    ),
    PdSide("colocated", engines=(Engine(), Engine()), gateway_args=("--upstream-policy", "prefix")),
)


@dataclass(frozen=True)
class SweepRun:
    """What one `semgate loadtest scenario pd` runs: the sides (the feature's first) and
    the rates (the SLOs judge the records afterwards: loadtest/sweep_report.py)."""

    sides: tuple[PdSide, ...] = PD_SIDES
    rates: tuple[float, ...] = DEFAULT_RATES
    num_threads: int = 1  # the engine's CPU threads in each server
    timeout: float = 300.0
    model: str = "smollm2-135m-instruct"
    seed: int = 0
    # A fault: each side's KV store is killed this many seconds into the sweep (after the
    # servers are up), and every request must still be answered.
    kill_store_after: float | None = None

    def __post_init__(self) -> None:
        if not self.rates or min(self.rates) <= 0 or len(set(self.rates)) != len(self.rates):
            raise ValueError(f"rates must be distinct and positive, got {self.rates}")
        if self.kill_store_after is not None and self.kill_store_after < 0:
            raise ValueError(f"kill_store_after must be >= 0, got {self.kill_store_after}")

    def engine_args(self, engine: Engine, store: str | None) -> list[str]:
        """An engine server's flags; `store` the side's Redis URL."""
        args = ["--no-cache", "--num-threads", str(self.num_threads), *engine.args()]
        if engine.kv_store:
            if store is None:
                raise ValueError("an engine with a KV store needs the side's Redis")
            args += ["--kv-store", store]
        return args

    def gateway_args(self, side: PdSide, urls: list[str]) -> list[str]:
        """The side's gateway in front of its engine servers (`urls`, in side.engines'
        order): the prefill ones as --upstream-prefill, the others as --upstream."""
        pools: dict[bool, list[str]] = {True: [], False: []}
        for engine, url in zip(side.engines, urls, strict=True):
            pools[engine.prefill].append(url)
        args = ["--no-cache", "--upstream", f"{self.model}={','.join(pools[False])}"]
        if pools[True]:
            args += ["--upstream-prefill", f"{self.model}={','.join(pools[True])}"]
        return [*args, *side.gateway_args]

    def command(self, side: PdSide) -> str:
        """The side's gateway and engine servers as command lines, for the report."""
        names = side.names()
        store = "redis://STORE/0" if side.kv_store else None
        lines = ["semgate serve " + " ".join(self.gateway_args(side, names))]
        lines += [
            f"{name}: semgate serve " + " ".join(self.engine_args(engine, store))
            for name, engine in zip(names, side.engines, strict=True)
        ]
        return "`; `".join(lines)

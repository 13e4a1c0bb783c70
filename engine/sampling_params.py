"""Per-request sampling settings, validated up front. The bounds are the ones requests
are held to everywhere: the gateway's request types declare these same `Bounds`
(gateway/request_fields.py), so its decoder and its OpenAPI document say what this
checks."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_STOP_STRINGS = 16
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class Bounds:
    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def __contains__(self, value: float) -> bool:
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
        )

    def __str__(self) -> str:
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}"
        return f"in {low}, {self.le:g}]" if self.le is not None else f"in {low}, inf)"


TEMPERATURE = Bounds(ge=0, le=2)  # 0 means greedy
TOP_P = Bounds(gt=0, le=1)
TOP_K = Bounds(ge=-1)  # -1 and 0: no top-k cut
MAX_TOKENS = Bounds(ge=1)
SEED = Bounds(ge=0, le=MAX_SEED)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    speculate: bool = True  # False opts this request out of speculative decoding

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.max_tokens, int) or self.max_tokens not in MAX_TOKENS:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature not in TEMPERATURE:
            raise ValueError(f"temperature must be {TEMPERATURE}, got {self.temperature}")
        if self.top_p not in TOP_P:
            raise ValueError(f"top_p must be {TOP_P}, got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k not in TOP_K:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if self.top_k == -1:
            self.top_k = 0
        if self.seed is not None and not (isinstance(self.seed, int) and self.seed in SEED):
            raise ValueError(f"seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

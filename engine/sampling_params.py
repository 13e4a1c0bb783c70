"""Per-request sampling settings, validated up front."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_STOP_STRINGS = 16
MAX_SEED = 2**63 - 1


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) means no top-k cut
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    speculate: bool = True  # False opts this request out of speculative decoding

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if self.top_k == -1:
            self.top_k = 0
        if self.seed is not None and not (
            isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED
        ):
            raise ValueError(f"seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

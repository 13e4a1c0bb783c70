"""Latency SLOs over a rate sweep: which requests meet them, the share that does at each
rate (SLO attainment), and goodput as DistServe defines it: the highest rate at which at
least 90% of requests meet both the TTFT and the ITL SLO.

A request's ITL is one number, as vLLM's `--goodput` takes it (its TPOT, per request): the
mean of its inter-token gaps, or their p90 where a few long gaps should count more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtest.record import RequestRecord

ITL_STATS = ("mean", "p90")
GOODPUT_ATTAINMENT = 0.9  # DistServe's


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    itl_ms: float
    itl_stat: str = "mean"  # of a request's gaps: one of ITL_STATS

    def __post_init__(self) -> None:
        if self.itl_stat not in ITL_STATS:
            raise ValueError(
                f"itl_stat must be one of {', '.join(ITL_STATS)}, not {self.itl_stat!r}"
            )
        if not (self.ttft_ms > 0 and self.itl_ms > 0):
            raise ValueError(f"SLOs must be positive, got TTFT {self.ttft_ms}, ITL {self.itl_ms}")

    def describe(self) -> str:
        return f"TTFT <= {self.ttft_ms:g} ms and {self.itl_stat} ITL <= {self.itl_ms:g} ms"

    def itl_ms_of(self, record: RequestRecord) -> float | None:
        """The request's ITL in ms; None where it had fewer than two content chunks."""
        if not record.itl:
            return None
        gaps = np.asarray(record.itl) * 1e3
        return float(gaps.mean() if self.itl_stat == "mean" else np.percentile(gaps, 90))

    def ttft_met(self, record: RequestRecord) -> bool:
        """A failed request meets neither SLO."""
        return record.ok and record.ttft is not None and record.ttft * 1e3 <= self.ttft_ms

    def itl_met(self, record: RequestRecord) -> bool:
        """An answer of one chunk has no gaps, so nothing to miss (vLLM: TPOT 0)."""
        itl = self.itl_ms_of(record)
        return record.ok and record.ttft is not None and (itl is None or itl <= self.itl_ms)


def attainment(records: list[RequestRecord], slo: Slo) -> dict[str, Any]:
    """Shares of `records` (every request sent) meeting both SLOs, the TTFT SLO alone and
    the ITL SLO alone: the last two tell which SLO limits the first."""
    n = len(records)
    ttft = [slo.ttft_met(r) for r in records]
    itl = [slo.itl_met(r) for r in records]
    both = sum(t and i for t, i in zip(ttft, itl, strict=True))
    return {
        "requests": n,
        "met": both,
        "attainment": both / n if n else None,
        "ttft_attainment": sum(ttft) / n if n else None,
        "itl_attainment": sum(itl) / n if n else None,
    }


@dataclass(frozen=True)
class Goodput:
    """Rates in requests per second. `rate` is the highest swept rate whose attainment,
    and every lower rate's, reached the target (a noisy pass above a failed rate does not
    count); None where the lowest rate missed it. `crossing` is where attainment, drawn
    straight from that rate to the next, falls to the target: between swept rates, for a
    finer comparison; None where no rate, or every rate, reached it."""

    rate: float | None
    crossing: float | None
    target: float
    highest_rate: float  # the sweep's: a goodput equal to it is a lower bound

    @property
    def above_sweep(self) -> bool:
        return self.rate == self.highest_rate

    def estimate(self) -> float | None:
        """The crossing where there is one, else the swept rate."""
        return self.crossing if self.crossing is not None else self.rate

    def describe(self) -> str:
        if self.rate is None:
            return f"below the lowest rate swept (under {self.target:.0%} there)"
        if self.above_sweep:
            return f"at least {self.rate:g} req/s (the highest rate swept)"
        assert self.crossing is not None
        return f"{self.rate:g} req/s (the curve crosses {self.target:.0%} at {self.crossing:.3g})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "crossing": self.crossing,
            "target": self.target,
            "above_sweep": self.above_sweep,
            "text": self.describe(),
        }


def goodput(by_rate: dict[float, float | None], target: float = GOODPUT_ATTAINMENT) -> Goodput:
    """Goodput from the attainment at each swept rate (a rate without requests: None,
    which counts as a miss)."""
    if not by_rate:
        raise ValueError("goodput needs at least one rate")
    rates = sorted(by_rate)
    met: float | None = None  # the highest rate so far that reached the target
    for rate in rates:
        value = by_rate[rate]
        if value is None or value < target:
            if met is None:
                return Goodput(None, None, target, rates[-1])
            low, high = by_rate[met], value or 0.0
            assert low is not None  # met it
            crossing = met + (rate - met) * (low - target) / (low - high)
            return Goodput(met, crossing, target, rates[-1])
        met = rate
    return Goodput(met, None, target, rates[-1])

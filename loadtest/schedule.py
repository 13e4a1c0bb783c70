"""Open-loop arrival times."""

from __future__ import annotations

import numpy as np


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """`count` arrival times (seconds from the start) of a Poisson process at `rate` per
    second: exponential gaps, the first one included, the same for the same seed."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, count)
    return np.cumsum(gaps).tolist()

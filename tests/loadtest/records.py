"""Hand-built request records for the SLO and sweep tests."""

from __future__ import annotations

from loadtest.record import RequestRecord
from loadtest.slo import Slo

SLO = Slo(ttft_ms=1000, itl_ms=60)


def record(
    ttft_s: float | None, gaps_s: list[float], *, long: bool = False, error: str | None = None
) -> RequestRecord:
    e2e = (ttft_s or 0.0) + sum(gaps_s)
    return RequestRecord(
        0, "rag" if long else "sharegpt", long, 64, True,
        ttft=ttft_s, itl=gaps_s, e2e=e2e, error=error,
    )  # fmt: skip

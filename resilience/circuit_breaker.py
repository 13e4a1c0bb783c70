"""A circuit breaker on a Redis: a Redis that hangs (paused, swapping, stuck on a slow
command) answers nothing, and without this every request would wait out a whole timeout
before it goes on without it (the cache's lookups; the engine's KV store transfers).

Closed, it counts calls that timed out waiting on Redis; `after` of them in a row open
it. Open, Redis is skipped (cache lookups are bypasses and stores are skipped; KV blocks
are recomputed and not saved) for `backoff` seconds. Then one call is let through as a
probe: if it answers, the breaker closes; if it times out, Redis is skipped again, for a
sixth of the time it has been skipped so far (at least `backoff`, at most
`max_backoff`). A probe costs its call a timeout, so a long outage is probed less often,
but Redis is found again within a sixth of the outage: doubling the back-off instead
kept the cache off for 12 s after a 30 s hang had ended (back-offs of 5, 10 and 20 s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# After a failed probe, Redis is skipped for this fraction of the time it has been.
OUTAGE_FRACTION = 1 / 6


class CircuitBreaker:
    def __init__(
        self,
        after: int = 3,
        backoff: float = 5.0,
        max_backoff: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        calls: str = "cache lookups",
        skipped: str = "the cache",
        logger: str = "semgate.cache",
    ) -> None:
        """`calls`: what it counts, `skipped`: what goes without Redis while it is open,
        in its messages; `logger`: where it says so."""
        if after < 1 or backoff <= 0:
            raise ValueError("a circuit breaker needs after >= 1 and backoff > 0")
        self.after = after
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.clock = clock
        self.calls = calls
        self.skipped = skipped
        self.log = logging.getLogger(logger)
        self.opens = 0  # times it opened (for /metrics)
        self._timeouts = 0  # in a row
        self._opened_at = 0.0  # when it opened (a failed probe does not reopen it)
        self._open_for = 0.0  # this skip's length; 0: closed
        self._until = 0.0  # skipped until then
        self._probe_since: float | None = None  # a probe is out (half open)

    @property
    def open(self) -> bool:
        """Whether Redis is being skipped (open, or half open with a probe out)."""
        return self._open_for > 0

    @property
    def reason(self) -> str | None:
        if not self.open:
            return None
        left = max(0.0, self._until - self.clock())
        return (
            f"Redis is not answering: {self._timeouts} {self.calls} in a row timed out; "
            f"{self.skipped} is skipped, tried again in {left:.0f} s"
        )

    def allows(self) -> bool:
        """Whether a call may ask Redis now. Once the backoff has passed, the first
        caller is the probe; another is let through if a probe never reported (its
        request went away) within the backoff."""
        if not self.open:
            return True
        now = self.clock()
        if now < self._until:
            return False
        if self._probe_since is not None and now - self._probe_since < self._open_for:
            return False
        self._probe_since = now
        return True

    def record_success(self) -> None:
        if self.open:
            self.log.info("Redis answers again: %s resume", self.calls)
        self._timeouts, self._open_for, self._probe_since = 0, 0.0, None

    def record_timeout(self) -> None:
        self._timeouts += 1
        probing = self._probe_since is not None
        if not probing and (self.open or self._timeouts < self.after):
            return
        now = self.clock()
        if not probing:
            self._opened_at = now
        skipped = (now - self._opened_at) * OUTAGE_FRACTION
        backoff = max(self.backoff, min(self.max_backoff, skipped))
        self._open_for, self._until, self._probe_since = backoff, now + backoff, None
        self.opens += 1
        self.log.warning("%d %s in a row timed out waiting on Redis: skipping %s for %.0f s",
                         self._timeouts, self.calls, self.skipped, backoff)  # fmt: skip

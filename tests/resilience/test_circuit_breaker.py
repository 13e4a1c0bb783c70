"""The cache's circuit breaker on its own, on a clock the test moves (the server test,
tests/gateway/test_redis_supervision.py, pauses a real Redis)."""

from __future__ import annotations

import pytest

from resilience.circuit_breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_opens_after_timeouts_in_a_row_and_closes_on_an_answer():
    clock = Clock()
    breaker = CircuitBreaker(after=3, backoff=5, clock=clock)
    for _ in range(2):
        breaker.record_timeout()
    breaker.record_success()  # an answer in between: not in a row
    for _ in range(2):
        breaker.record_timeout()
    assert breaker.allows() and not breaker.open and breaker.reason is None
    breaker.record_timeout()
    assert breaker.open and breaker.opens == 1
    assert not breaker.allows()
    assert "3 cache lookups in a row timed out" in (breaker.reason or "")
    clock.now += 5
    assert breaker.allows()  # the probe
    assert not breaker.allows()  # one at a time
    breaker.record_success()
    assert not breaker.open and breaker.allows() and breaker.reason is None


def _probes(breaker: CircuitBreaker, clock: Clock, hang: float, timeout: float = 1.0) -> float:
    """Calls every 0.1 s from the breaker's opening; Redis answers after `hang` seconds
    and each probe before then times out after `timeout`: when a probe found it again."""
    start = clock.now
    while True:
        clock.now += 0.1
        if breaker.allows():
            clock.now += timeout
            if clock.now - start >= hang:
                breaker.record_success()
                return clock.now - start
            breaker.record_timeout()


def test_a_failed_probe_skips_redis_for_a_sixth_of_the_outage_within_bounds():
    clock = Clock()
    breaker = CircuitBreaker(after=1, backoff=5, max_backoff=12, clock=clock)
    breaker.record_timeout()
    skips = []
    for _ in range(14):
        waited = clock.now
        while not breaker.allows():
            clock.now += 0.5
        skips.append(clock.now - waited)
        breaker.record_timeout()  # the probe timed out too
    assert skips[:5] == [5.0] * 5  # a sixth of under 30 s is under the floor
    assert skips == sorted(skips) and skips[-1] == 12.0  # longer, up to the cap
    assert breaker.opens == 15


@pytest.mark.parametrize("hang", [10.0, 30.0, 61.0])
def test_redis_is_found_again_soon_after_a_hang(hang: float):
    """The issue's 30 s hang kept the cache off 12 s longer with doubling back-offs (5,
    10, 20 s); now Redis is asked again within `backoff` or a sixth of the hang, whichever
    is longer (plus the probe's timeout)."""
    clock = Clock()
    breaker = CircuitBreaker(after=1, backoff=5, clock=clock)
    breaker.record_timeout()
    assert _probes(breaker, clock, hang) - hang <= max(5, hang / 6) + 1 + 0.2


def test_timeouts_of_lookups_already_in_flight_do_not_extend_it():
    clock = Clock()
    breaker = CircuitBreaker(after=2, backoff=5, clock=clock)
    breaker.record_timeout()
    breaker.record_timeout()
    breaker.record_timeout()  # started before it opened
    clock.now += 5
    assert breaker.allows() and breaker.opens == 1


def test_a_probe_that_never_reports_is_replaced():
    clock = Clock()
    breaker = CircuitBreaker(after=1, backoff=5, clock=clock)
    breaker.record_timeout()
    clock.now += 5
    assert breaker.allows()  # its request went away: no record
    clock.now += 4.9
    assert not breaker.allows()
    clock.now += 0.1
    assert breaker.allows()


@pytest.mark.parametrize("after, backoff", [(0, 5.0), (3, 0.0)])
def test_bad_settings_are_refused(after: int, backoff: float):
    with pytest.raises(ValueError):
        CircuitBreaker(after=after, backoff=backoff)

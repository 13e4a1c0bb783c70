"""SLO attainment and goodput over a rate sweep (loadtest/slo.py), from hand-built records."""

from __future__ import annotations

import pytest

from loadtest.slo import Slo, attainment, goodput
from tests.loadtest.records import SLO, record


def test_a_request_meets_the_slos_by_its_ttft_and_its_mean_or_p90_gap() -> None:
    # 31 decode steps of 20 ms, then 4 steps of 150 ms beside another prompt's chunks.
    stalled = record(0.8, [0.02] * 31 + [0.15] * 4)
    assert SLO.itl_ms_of(stalled) == pytest.approx(34.857, abs=1e-3)  # (620 + 600) / 35
    assert SLO.ttft_met(stalled) and SLO.itl_met(stalled)
    p90 = Slo(1000, 60, "p90")
    assert p90.itl_ms_of(stalled) == pytest.approx(98.0)  # 20 + 0.6 * 130, interpolated
    assert not p90.itl_met(stalled)
    late = record(1.2, [0.02] * 10)
    assert not SLO.ttft_met(late) and SLO.itl_met(late)
    one_chunk = record(0.5, [])
    assert SLO.itl_ms_of(one_chunk) is None and SLO.itl_met(one_chunk)
    failed = record(0.1, [0.01], error="http_502")
    assert not SLO.ttft_met(failed) and not SLO.itl_met(failed)
    no_token = record(None, [])
    assert not SLO.ttft_met(no_token) and not SLO.itl_met(no_token)
    with pytest.raises(ValueError, match="itl_stat must be one of mean, p90"):
        Slo(1000, 60, "p99")
    with pytest.raises(ValueError, match="SLOs must be positive"):
        Slo(0, 60)


def test_attainment_counts_every_request_sent_and_says_which_slo_limits() -> None:
    records = [
        record(0.3, [0.02] * 20),  # meets both
        record(0.4, [0.02] * 20),  # meets both
        record(0.5, [0.09] * 20),  # ITL 90 ms
        record(0.6, [0.10] * 20),  # ITL 100 ms
        record(2.5, [0.02] * 20),  # TTFT 2.5 s
        record(None, [], error="timeout"),
    ]
    assert attainment(records, SLO) == {
        "requests": 6,
        "met": 2,
        "attainment": pytest.approx(2 / 6),
        "ttft_attainment": pytest.approx(4 / 6),
        "itl_attainment": pytest.approx(3 / 6),
    }
    assert attainment([], SLO)["attainment"] is None


def test_goodput_is_the_highest_rate_that_it_and_every_lower_one_met() -> None:
    falling = goodput({0.1: 1.0, 0.2: 0.95, 0.3: 0.8, 0.4: 0.5})
    assert falling.rate == 0.2 and not falling.above_sweep
    assert falling.crossing == pytest.approx(0.2 + 0.1 * 0.05 / 0.15)  # 0.2333
    assert falling.estimate() == pytest.approx(0.2333, abs=1e-4)
    assert falling.describe() == "0.2 req/s (the curve crosses 90% at 0.233)"
    # A pass above a failed rate is noise, not goodput.
    noisy = goodput({0.3: 0.92, 0.1: 0.95, 0.2: 0.85})
    assert noisy.rate == 0.1 and noisy.crossing == pytest.approx(0.15)
    everywhere = goodput({0.1: 1.0, 0.2: 0.9})
    assert everywhere.rate == 0.2 and everywhere.above_sweep and everywhere.crossing is None
    assert everywhere.describe() == "at least 0.2 req/s (the highest rate swept)"
    nowhere = goodput({0.1: 0.85, 0.2: 0.5})
    assert nowhere.rate is None and nowhere.estimate() is None
    assert nowhere.describe() == "below the lowest rate swept (under 90% there)"
    empty_rate = goodput({0.1: 0.95, 0.2: None})  # no request at 0.2: a miss
    assert empty_rate.rate == 0.1 and empty_rate.crossing == pytest.approx(0.1 + 0.1 * 0.05 / 0.95)
    with pytest.raises(ValueError):
        goodput({})

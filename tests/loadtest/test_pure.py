"""The parts without a server: arrival schedules, percentiles, workload order, requests."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.client import Endpoint
from loadtest.headline import Headline
from loadtest.record import RequestRecord
from loadtest.repeat import BLOCK, question_groups, repeat_order
from loadtest.schedule import poisson_arrivals
from loadtest.summary import summarize
from loadtest.work_item import WorkItem


def test_poisson_schedule_is_seeded_and_has_the_rate() -> None:
    a = poisson_arrivals(2.0, 4000, seed=7)
    assert a == poisson_arrivals(2.0, 4000, seed=7)
    assert a != poisson_arrivals(2.0, 4000, seed=8)
    gaps = np.diff([0.0, *a])
    assert (gaps > 0).all()
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)  # 4000 samples: sd of the mean 1.6%
    assert gaps.std() == pytest.approx(0.5, rel=0.1)  # exponential: sd equals the mean
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 3, seed=0)


def test_summary_percentiles_rates_and_errors() -> None:
    records = [
        RequestRecord(
            i, "sharegpt", False, 8, True, ttft=(i + 1) / 100, itl=[0.01] * 9,
            e2e=(i + 1) / 100 + 0.09, completion_tokens=10, cache_status="Miss",
        )
        for i in range(100)
    ]  # fmt: skip
    records[0].cache_status = "Hit"
    failed = RequestRecord(100, "rag", True, 8, True, e2e=0.5, error="http_429")
    summary = summarize([*records, failed], elapsed=10.0)
    assert summary["ttft"]["p50_ms"] == pytest.approx(505.0)  # 10..1000 ms, interpolated
    assert summary["ttft"]["p99_ms"] == pytest.approx(990.1)
    assert summary["itl"]["n"] == 900
    assert summary["itl"]["p99_ms"] == pytest.approx(10.0)
    assert summary["completed"] == 100
    assert summary["errors_by_kind"] == {"http_429": 1}
    assert summary["error_rate"] == pytest.approx(1 / 101)
    assert summary["request_throughput"] == pytest.approx(10.0)
    assert summary["output_token_throughput"] == pytest.approx(100.0)
    assert summary["cache_hit_rate"] == pytest.approx(0.01)
    assert summary["long"]["ttft"]["n"] == 0


def test_repeat_order_asks_each_question_before_its_paraphrases() -> None:
    groups = question_groups()
    assert len(groups) >= 60 and min(len(g) for g in groups) >= 4
    total = sum(len(g) for g in groups)
    order = repeat_order(groups, total + 5, seed=1)
    assert order == repeat_order(groups, total + 5, seed=1)
    first_cycle = order[:total]
    assert sorted(first_cycle) == sorted((g, a) for g in range(len(groups)) for a in range(4))
    for group in range(len(groups)):
        asks = [(pos, a) for pos, (g, a) in enumerate(first_cycle) if g == group]
        assert [a for _, a in asks] == [0, 1, 2, 3]
        assert asks[1][0] - asks[0][0] > 1  # other questions come in between
    assert order[:BLOCK] == [(g, 0) for g, _ in order[:BLOCK]]  # a block of first asks
    assert order[total:] == order[:5]  # then the same again


def test_request_body_and_url() -> None:
    item = WorkItem([{"role": "user", "content": "hi"}], 16, exact_length=True, kind="sharegpt")
    natural = WorkItem([{"role": "user", "content": "hi"}], 16, exact_length=False, kind="repeat")
    endpoint = Endpoint(Endpoint.chat_url("http://h:1/v1/"), "m", api_key="k")
    assert endpoint.url == "http://h:1/v1/chat/completions"
    assert Endpoint.chat_url("http://h:1") == endpoint.url
    assert endpoint.headers() == {"Authorization": "Bearer k"}
    assert Endpoint(endpoint.url, "m", cache_store=False).headers() == {"Cache-Control": "no-store"}
    body = endpoint.body(item)
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 16
    assert "ignore_eos" not in endpoint.body(natural)
    assert "ignore_eos" not in Endpoint(endpoint.url, "m", ignore_eos=False).body(item)


def test_headline_ratio_and_goal() -> None:
    summaries = {"on": {"itl": {"p99_ms": 100.0}}, "off": {"itl": {"p99_ms": 450.0}}}
    headline = Headline.of("p99 ITL", ("itl", "p99_ms"), summaries, goal=3.0)
    assert headline.ratio == pytest.approx(4.5) and headline.met is True
    assert "4.50x lower with on" in headline.text() and "met" in headline.text()
    assert Headline.of("p99 ITL", ("itl", "p99_ms"), summaries, goal=5.0).met is False
    empty = {"on": {"itl": {"p99_ms": None}}, "off": {"itl": {"p99_ms": 450.0}}}
    assert Headline.of("p99 ITL", ("itl", "p99_ms"), empty, goal=3.0).met is None

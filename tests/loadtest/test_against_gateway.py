"""Every workload, briefly, against one real gateway over HTTP; the numbers must agree with
each other and with the server's usage counts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cache.redis_server import free_port
from loadtest.client import Endpoint
from loadtest.meta import RunInfo
from loadtest.phases import TTFT_PARTS
from loadtest.record import CACHE_STATUSES, RequestRecord
from loadtest.report import write_run_report
from loadtest.runner import LoadShape, RunResult, run_load
from loadtest.schedule import poisson_arrivals
from loadtest.summary import summarize
from loadtest.tokens import load_tokenizer
from loadtest.work_item import WorkItem, WorkloadOptions
from tests.gateway.fixtures import LOADTEST
from tests.gateway.servers import MODEL, Server


@pytest.fixture(scope="module")
def endpoint(gateway: Server) -> Endpoint:
    return Endpoint(Endpoint.chat_url(gateway.url), MODEL, api_key=LOADTEST, timeout=120)


def _run(endpoint: Endpoint, items: list[WorkItem], shape: LoadShape) -> RunResult:
    return asyncio.run(run_load(items, endpoint, shape))


def _prompt_tokens(item: WorkItem) -> int:
    """The prompt's own tokens, chat template excluded: a lower bound of the usage count."""
    tokenizer = load_tokenizer(MODEL)
    return sum(len(tokenizer.encode(m["content"])) for m in item.messages)


def _check_consistent(records: list[RequestRecord], items: list[WorkItem]) -> None:
    for r in records:
        assert r.ok, (r.error, r.error_code, r.error_message)
        assert r.status_code == 200 and r.cache_status in CACHE_STATUSES
        assert r.ttft is not None and r.e2e is not None
        assert 0 < r.ttft <= r.e2e
        assert r.ttft + sum(r.itl) <= r.e2e
        assert all(gap >= 0 for gap in r.itl)
        item = items[r.index]
        assert (r.kind, r.long, r.max_tokens) == (item.kind, item.long, item.max_tokens)
        assert r.prompt_tokens is not None and r.prompt_tokens >= _prompt_tokens(item)
        assert r.completion_tokens is not None and 1 <= r.completion_tokens <= r.max_tokens
        assert len(r.itl) + 1 <= r.completion_tokens  # a chunk carries one token or more
        if r.ignore_eos and r.cache_status != "Hit":
            assert r.completion_tokens == r.max_tokens
            assert r.finish_reason == "length"
        _check_timings(r)


def _check_timings(r: RequestRecord) -> None:
    """The gateway's phases: a hit was only looked up, a miss also went through the engine,
    whose queue and prefill came before the first token and its decode after."""
    assert r.timings is not None and all(ms >= 0 for ms in r.timings.values())
    assert r.ttft is not None and r.e2e is not None
    if r.cache_status == "Hit":
        assert {"cache"} <= set(r.timings) <= {"cache", "embed"}
        return
    assert {"queue", "prefill", "decode"} <= set(r.timings)
    timings_s = {name: ms / 1e3 for name, ms in r.timings.items()}
    slack = 1e-3  # the server rounds to a tenth of a millisecond
    assert timings_s["queue"] + timings_s["prefill"] <= r.ttft + slack
    assert timings_s["queue"] + timings_s["prefill"] + timings_s["decode"] <= r.e2e + slack


def test_sharegpt_open_loop(endpoint: Endpoint, sharegpt: list[WorkItem]) -> None:
    items = sharegpt[:4]
    result = _run(endpoint, items, LoadShape(rate=4.0))
    assert [r.index for r in sorted(result.records, key=lambda r: r.index)] == [0, 1, 2, 3]
    _check_consistent(result.records, items)
    assert all(r.ignore_eos and r.cache_status == "Miss" for r in result.records)
    summary = summarize(result.records, result.elapsed)
    assert summary["completed"] == 4 and summary["error_rate"] == 0
    assert summary["output_tokens"] == sum(i.max_tokens for i in items)
    assert summary["ttft"]["p50_ms"] <= summary["e2e"]["p50_ms"]


def test_rag_long_prompts(endpoint: Endpoint, rag: list[WorkItem]) -> None:
    result = _run(endpoint, rag, LoadShape(concurrency=2))
    _check_consistent(result.records, rag)
    assert all(r.long and (r.prompt_tokens or 0) >= 1024 for r in result.records)


def test_mixed_has_both_kinds_and_says_where_the_time_goes(
    endpoint: Endpoint, mixed: list[WorkItem], tmp_path: Path
) -> None:
    result = _run(endpoint, mixed, LoadShape(concurrency=2))
    _check_consistent(result.records, mixed)
    assert {r.kind for r in result.records} == {"sharegpt", "rag"}
    summary = summarize(result.records, result.elapsed)
    phases = summary["phases"]
    assert phases is not None and phases["timed_requests"] == len(mixed)
    for group in phases["ttft"].values():
        assert group["requests"] >= 1
        assert set(group["shares"]) == set(TTFT_PARTS)
        assert all(share >= 0 for share in group["shares"].values())
        assert sum(group["shares"].values()) == pytest.approx(1.0)
    assert 0 <= phases["decode_share_of_e2e"] <= 1
    runs, summaries = {"mixed": result.records}, {"mixed": summary}
    info = RunInfo("mixed", WorkloadOptions(4), LoadShape(concurrency=2), {})
    text = write_run_report(tmp_path, "t", "intro", runs, summaries, info).read_text()
    section = text.split("## Where the time goes\n\n", 1)[1]
    assert f"Diagnosis: {phases['diagnosis']}." in section
    assert (tmp_path / "ttft_split.png").stat().st_size > 0
    assert summary["long_requests"] == sum(i.long for i in mixed) > 0


def test_repeat_hits_after_first_asks(endpoint: Endpoint, repeat: list[WorkItem]) -> None:
    """The first 8 requests ask 8 questions for the first time (misses on this fresh
    cache), all at once; then the next 8 ask them again in other words, after their
    answers were stored."""
    first = _run(endpoint, repeat[:8], LoadShape(concurrency=8))
    again = _run(endpoint, repeat[8:], LoadShape(concurrency=8))
    _check_consistent(first.records, repeat[:8])
    _check_consistent(again.records, repeat[8:])
    asked = sorted(first.records, key=lambda r: r.index)
    reasked = sorted(again.records, key=lambda r: r.index)
    assert not any(r.ignore_eos for r in asked + reasked)
    assert [r.cache_status for r in asked] == ["Miss"] * 8
    stored = [r.finish_reason == "stop" for r in asked]
    hits = [r.cache_status == "Hit" for r in reasked]
    assert sum(hits) >= sum(stored) - 2 >= 4  # the guard may turn down a paraphrase or two
    summary = summarize(asked + reasked, first.elapsed + again.elapsed)
    assert summary["cache_hit_rate"] == pytest.approx(sum(hits) / 16)
    assert summary["hits"]["requests"] == sum(hits) == summary["hits"]["e2e"]["n"]
    assert summary["misses"]["requests"] == 16 - sum(hits)  # the cache was asked: no Bypass
    cut = sum(r.finish_reason == "length" for r in asked + reasked if r.cache_status == "Miss")
    assert summary["misses"]["at_output_limit"] == cut
    for original, r in zip(asked, reasked, strict=True):
        if r.cache_status == "Hit":  # replayed in one chunk, with the stored usage
            assert r.itl == [] and r.completion_tokens == original.completion_tokens
            # and the time its answer took, within the request that generated it
            assert original.e2e is not None and 0 < (r.saved_seconds or 0) < original.e2e
    assert summary["saved_by_cache"] == {
        "tokens": sum(r.completion_tokens or 0 for r in reasked if r.cache_status == "Hit"),
        "seconds": pytest.approx(sum(r.saved_seconds or 0 for r in reasked)),
        "hits_without_seconds": 0,
    }


def test_closed_loop_stops_at_the_request_bound(
    endpoint: Endpoint, sharegpt: list[WorkItem]
) -> None:
    result = _run(endpoint, sharegpt[4:7], LoadShape(concurrency=2))
    assert sorted(r.index for r in result.records) == [0, 1, 2]
    assert all(r.ok for r in result.records)


def test_closed_loop_stops_at_the_duration(endpoint: Endpoint, sharegpt: list[WorkItem]) -> None:
    # One at a time, each generating 4 tokens or more: 1000 cannot all be answered in 1 s.
    items = sharegpt * 25
    result = _run(endpoint, items, LoadShape(concurrency=1, duration=1.0))
    assert 1 <= len(result.records) < len(items)
    assert all(r.sent_at <= 1.0 and r.ok for r in result.records)  # in flight: finished


def test_open_loop_stops_at_the_duration(endpoint: Endpoint, sharegpt: list[WorkItem]) -> None:
    result = _run(endpoint, sharegpt, LoadShape(rate=4.0, duration=1.5, seed=5))
    planned = [at for at in poisson_arrivals(4.0, len(sharegpt), seed=5) if at <= 1.5]
    assert len(result.records) == len(planned) < len(sharegpt)
    assert all(r.ok for r in result.records)


def test_errors_are_recorded_by_kind(gateway: Server, sharegpt: list[WorkItem]) -> None:
    wrong_model = Endpoint(
        Endpoint.chat_url(gateway.url), "no-such-model", api_key=LOADTEST, timeout=60
    )
    closed_port = Endpoint(Endpoint.chat_url(f"http://127.0.0.1:{free_port()}"), MODEL)
    shape = LoadShape(concurrency=1)
    records = [r for e in (wrong_model, closed_port) for r in _run(e, sharegpt[:1], shape).records]
    assert [(r.error, r.status_code) for r in records] == [("http_404", 404), ("connect", None)]
    assert records[0].error_code == "model_not_found" and records[0].error_message
    summary = summarize(records, 1.0)
    assert summary["error_rate"] == 1.0 and summary["completed"] == 0
    assert summary["errors_by_kind"] == {"http_404": 1, "connect": 1}

"""A run's records reduced to the numbers a report shows."""

from __future__ import annotations

from collections import Counter
from typing import Any

from loadtest.phases import where_the_time_goes
from loadtest.record import RequestRecord


def latency_samples(records: list[RequestRecord]) -> dict[str, list[float]]:
    """TTFT, every inter-token gap and end-to-end latency of `records`, in seconds."""
    return {
        "ttft": [r.ttft for r in records if r.ttft is not None],
        "itl": [gap for r in records for gap in r.itl],
        "e2e": [r.e2e for r in records if r.e2e is not None],
    }


def cache_split(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """The hits and the misses among `records` (Bypass and no status in neither): a hit is
    a lookup and a replay, a miss a lookup and a whole generation, so one percentile over
    both describes neither."""
    return {
        "hits": [r for r in records if r.cache_status == "Hit"],
        "misses": [r for r in records if r.cache_status == "Miss"],
    }


def _latency(records: list[RequestRecord]) -> dict[str, Any]:
    from bench.report import summary_ms

    return {name: summary_ms(values) for name, values in latency_samples(records).items()}


def _by_cache_status(done: list[RequestRecord]) -> dict[str, Any]:
    """Count and latency of the hits and of the misses; for the misses also how many ended
    at the output limit (never stored: the cache keeps only answers that ended by
    themselves) and the highest such limit."""
    split = cache_split(done)
    cut = [r for r in split["misses"] if r.finish_reason == "length"]
    return {
        "hits": {"requests": len(split["hits"]), **_latency(split["hits"])},
        "misses": {
            "requests": len(split["misses"]),
            **_latency(split["misses"]),
            "at_output_limit": len(cut),
            "max_tokens": max((r.max_tokens for r in cut), default=None),
        },
    }


def saved_by_cache(done: list[RequestRecord]) -> dict[str, Any]:
    """What the hits among completed requests saved, as their responses told: `tokens`, the
    completion tokens of their usage (the stored answers' own, not generated again), and
    `seconds`, the generation time of those whose X-Cache-Saved-Seconds came
    (`hits_without_seconds`: the hits it did not come with)."""
    hits = cache_split(done)["hits"]
    timed = [r.saved_seconds for r in hits if r.saved_seconds is not None]
    return {
        "tokens": sum(r.completion_tokens or 0 for r in hits),
        "seconds": sum(timed, 0.0),
        "hits_without_seconds": len(hits) - len(timed),
    }


def prefill_stall_gaps(records: list[RequestRecord]) -> list[float]:
    """Inter-token gaps of the short (chat) streams that overlap a window in which a long
    prompt waited for its first token: where its prefill can stall them. Over whole streams
    such gaps are too rare to show at p99."""
    windows = [(r.sent_at, r.sent_at + r.ttft) for r in records if r.long and r.ttft is not None]
    return [
        gap
        for r in records
        if r.ok and not r.long
        for end, gap in zip(r.chunk_times()[1:], r.itl, strict=True)
        if any(end - gap < w_end and end > w_start for w_start, w_end in windows)
    ]


def summarize(records: list[RequestRecord], elapsed: float) -> dict[str, Any]:
    """Latency percentiles over completed requests (ITL over every gap of every stream),
    throughput over the run's wall time, cache hit rate over requests that got a cache
    status, error rate over all requests sent; `hits` and `misses` apart; `phases` as
    loadtest.phases gives them."""
    from bench.report import summary_ms

    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    statuses = Counter(r.cache_status for r in done if r.cache_status is not None)
    with_status = sum(statuses.values())
    output_tokens = sum(r.completion_tokens or 0 for r in done)
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": len(failed),
        "error_rate": len(failed) / len(records) if records else 0.0,
        "errors_by_kind": dict(Counter(r.error or "unknown" for r in failed)),
        "long_requests": sum(r.long for r in records),
        "elapsed_s": elapsed,
        "request_throughput": len(done) / elapsed if elapsed > 0 else 0.0,
        "output_token_throughput": output_tokens / elapsed if elapsed > 0 else 0.0,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in done),
        "output_tokens": output_tokens,
        "cache_status": dict(statuses),
        "cache_hit_rate": statuses["Hit"] / with_status if with_status else None,
        **_latency(done),
        **_by_cache_status(done),
        "saved_by_cache": saved_by_cache(done),
        "itl_during_long_prefill": summary_ms(prefill_stall_gaps(done)),
        "long": _latency([r for r in done if r.long]),
        "short": _latency([r for r in done if not r.long]),
        "phases": where_the_time_goes(done),
    }

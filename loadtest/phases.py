"""Where the time goes: the server's per-phase timings (RequestRecord.timings) set against
what the client measured, reduced to the shares of TTFT at p50 and p99, the stalls (inter-
token gaps far above the median) and how many coincide with another request's prefill,
and a one-line diagnosis."""

from __future__ import annotations

from typing import Any

import numpy as np

from loadtest.record import RequestRecord

# The parts of TTFT, in the order the report and the chart show them, with their labels.
# `pd-prefill` is a prompt's prefill on a prefill server, before its decode server's own
# queue and `prefill` (there, loading that KV): gateway/upstream/disaggregation.py.
TTFT_PARTS = ("queue", "pd-prefill", "prefill", "cache", "other")
PART_LABELS = {
    "queue": "queue",
    "pd-prefill": "remote prefill",
    "prefill": "prefill",
    "cache": "cache lookup",
    "other": "other",
}
# Requests whose TTFT ranks within this many percentile points of p50 make up its group.
P50_WINDOW = 5.0
# A stall is a gap of at least STALL_FACTOR times the run's median gap: with chunked
# prefill the gaps beside a prompt's chunks are slower too (each step carries a chunk),
# but by 1-3x; a whole prompt prefilled in one step stops the streams for 10-40x.
STALL_FACTOR = 4.0
# Diagnosis thresholds (see diagnose).
QUEUE_BOUND = 0.5
PD_PREFILL_BOUND = 0.5
# Stalls matter when what they add over the median gap is this share of all the time
# between tokens: then the streams wait on prefills more than on their own decode.
STALL_TIME_BOUND = 0.2
PREFILL_STALL_BOUND = 0.5  # of the stalls, during another request's prefill
CACHE_BOUND = 0.2
PREFILL_BOUND = 0.4
DECODE_BOUND = 0.5


def _ms(record: RequestRecord, name: str) -> float:
    return (record.timings or {}).get(name, 0.0)


def ttft_parts(record: RequestRecord) -> dict[str, float]:
    """A request's TTFT split into seconds of queue, remote prefill, prefill, cache lookup
    (embedding included) and other (network, gateway, tokenization: TTFT minus the rest, floored
    at 0). The server's phases are durations, not a partition (an engine request started
    early runs while the cache is asked), so they may add up to more than TTFT; then
    `other` is 0 and the parts' sum, not TTFT, is the whole they are shares of."""
    assert record.ttft is not None
    parts = {name: _ms(record, name) / 1e3 for name in TTFT_PARTS[:-1]}
    parts["other"] = max(0.0, record.ttft - sum(parts.values()))
    return parts


def _timed(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.ttft is not None and r.timings]


def percentile_group(records: list[RequestRecord], percentile: float) -> list[RequestRecord]:
    """The requests around a TTFT percentile: for p50 those ranked within P50_WINDOW
    points of it (at least the one nearest), for a tail percentile those at or above it
    (at least the slowest)."""
    if not records:
        return []
    ttfts = np.array([r.ttft for r in records], dtype=float)
    cut = float(np.percentile(ttfts, percentile))
    if percentile >= 90:
        group = [r for r, t in zip(records, ttfts, strict=True) if t >= cut]
    else:
        lo, hi = np.percentile(ttfts, [percentile - P50_WINDOW, percentile + P50_WINDOW])
        group = [r for r, t in zip(records, ttfts, strict=True) if lo <= t <= hi]
    return group or [records[int(np.argmin(np.abs(ttfts - cut)))]]


def ttft_shares(group: list[RequestRecord]) -> dict[str, float]:
    """The group's TTFT parts as shares of their total: each part summed over the group,
    over the sum of the parts (so slow requests weigh more, and the shares sum to 1)."""
    totals = dict.fromkeys(TTFT_PARTS, 0.0)
    for record in group:
        for name, seconds in ttft_parts(record).items():
            totals[name] += seconds
    whole = sum(totals.values())
    return {name: (s / whole if whole else 0.0) for name, s in totals.items()}


def prefill_interval(record: RequestRecord) -> tuple[float, float] | None:
    """When the request's prompt was prefilled, on the client's clock (from the run's
    start): the `prefill` milliseconds the server reported, ending at its first token's
    arrival. This ignores the network and the first token's own decode step, both short
    next to a long prefill."""
    if record.ttft is None or not record.timings or "prefill" not in record.timings:
        return None
    first = record.sent_at + record.ttft
    return first - record.timings["prefill"] / 1e3, first


def stalls_during_prefill(records: list[RequestRecord]) -> dict[str, Any]:
    """The stalls (gaps of STALL_FACTOR times the median gap or more) and how many of
    them overlap another request's prefill interval: the gaps a prefill may have caused."""
    done = [r for r in records if r.ok]
    all_gaps = [gap for r in done for gap in r.itl]
    if not all_gaps:
        return {"gaps": 0, "median_gap_ms": None, "threshold_ms": None, "stalls": 0,
                "during_prefill": 0, "median_stall_ms": None, "time_share": 0.0}  # fmt: skip
    median = float(np.median(all_gaps))
    threshold = STALL_FACTOR * median
    intervals = [(r.index, iv) for r in done if (iv := prefill_interval(r)) is not None]
    stalls: list[float] = []
    coinciding = 0
    for r in done:
        for end, gap in zip(r.chunk_times()[1:], r.itl, strict=True):
            if gap < threshold:
                continue
            stalls.append(gap)
            # Open intervals: a gap that merely touches a prefill's end did not wait on it.
            coinciding += any(
                index != r.index and end - gap < hi and end > lo for index, (lo, hi) in intervals
            )
    return {
        "gaps": len(all_gaps),
        "median_gap_ms": median * 1e3,
        "threshold_ms": threshold * 1e3,
        "stalls": len(stalls),
        "during_prefill": coinciding,
        "median_stall_ms": float(np.median(stalls)) * 1e3 if stalls else None,
        # What the stalls added over the median gap, as a share of all inter-token time.
        "time_share": sum(gap - median for gap in stalls) / sum(all_gaps),
    }


def share_of_e2e(records: list[RequestRecord], phase: str) -> float | None:
    """The server's `phase` time summed over the requests that report it, over their
    summed end-to-end time."""
    timed = [r for r in _timed(records) if phase in (r.timings or {}) and r.e2e]
    e2e = sum(r.e2e or 0.0 for r in timed)
    return sum(_ms(r, phase) / 1e3 for r in timed) / e2e if e2e else None


def _engine_diagnosis(phases: dict[str, Any]) -> str:
    """The first rule that holds: p99 TTFT more than half queueing; more than half remote
    prefill (on prefill servers; absent from summaries before it); stalls adding more
    than STALL_TIME_BOUND of the inter-token time, more than half of them during another
    request's prefill; p99 TTFT more than a fifth cache lookup; prefill a larger share of e2e than
    decode, and over PREFILL_BOUND; decode more than half of e2e; else none."""
    p99 = phases["ttft"]["p99"]["shares"]
    stalls = phases["stalls"]
    prefill, decode = phases["prefill_share_of_e2e"], phases["decode_share_of_e2e"]
    if p99["queue"] > QUEUE_BOUND:
        return f"p99 TTFT is {p99['queue']:.0%} queueing: add capacity or lower max_num_seqs"
    if (remote := p99.get("pd-prefill", 0.0)) > PD_PREFILL_BOUND:
        return (
            f"p99 TTFT is {remote:.0%} remote prefill: add prefill servers, or raise "
            "--pd-min-prompt-tokens so that shorter prompts prefill on the decode servers"
        )
    n, lost = stalls["stalls"], stalls["time_share"]
    if lost > STALL_TIME_BOUND and stalls["during_prefill"] > PREFILL_STALL_BOUND * n:
        return (
            f"ITL spikes coincide with long prefills ({stalls['during_prefill']} of {n} "
            f"stalls, median {stalls['median_stall_ms']:,.0f} ms, {lost:.0%} of the time "
            "between tokens): enable chunked prefill or lower max_num_batched_tokens"
        )
    if p99["cache"] > CACHE_BOUND:
        return (
            f"p99 TTFT is {p99['cache']:.0%} cache lookup: a faster embedder or a nearer "
            "Redis, or turn the cache off for this traffic"
        )
    if prefill is not None and prefill > PREFILL_BOUND and prefill > (decode or 0):
        return (
            f"prefill-bound ({prefill:.0%} of e2e is prefill): long prompts; prefix caching "
            "for shared context, shorter prompts or a faster prefill"
        )
    if decode is not None and decode > DECODE_BOUND:
        return f"decode-bound ({decode:.0%} of e2e is decode): speculative decoding or quantization"
    return "no single phase dominates: queueing, prefill stalls and decode are all below bounds"


def diagnose(phases: dict[str, Any]) -> str:
    """One line: the engine's diagnosis (_engine_diagnosis), prefixed, when some answers
    came from the cache, with how many: the cache's share is the first lever of a cache
    gateway, and hits carry no engine phases (the rules then read the misses)."""
    engine = _engine_diagnosis(phases)
    hits = phases["cache_hits"]
    if not hits:
        return engine
    share = hits / phases["timed_requests"]
    return f"{share:.0%} answered from the cache; the rest: {engine}"


def where_the_time_goes(records: list[RequestRecord]) -> dict[str, Any] | None:
    """The section's numbers, or None when no completed request carried timings (a
    server that reports no phases, such as vLLM or OpenAI)."""
    timed = _timed(records)
    if not timed:
        return None
    ttft: dict[str, Any] = {}
    for label, percentile in (("p50", 50.0), ("p99", 99.0)):
        group = percentile_group(timed, percentile)
        ttft[label] = {"requests": len(group), "shares": ttft_shares(group)}
    phases = {
        "timed_requests": len(timed),
        "ttft": ttft,
        "stalls": stalls_during_prefill(records),
        "prefill_share_of_e2e": share_of_e2e(records, "prefill"),
        "decode_share_of_e2e": share_of_e2e(records, "decode"),
        "cache_hits": sum(r.cache_status == "Hit" for r in timed),
    }
    phases["diagnosis"] = diagnose(phases)
    return phases

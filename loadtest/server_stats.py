"""The engine servers behind a scenario side's gateway, from /metrics scraped before and
after the measured rounds: how many requests the gateway sent each (and why: its
`semgate_upstream_requests_total`), and the prefix-cache hit rate each reports (its own
`semgate_prefix_cache_hits_total` over `_queries_total`, prompt tokens); and for the pd
scenario what any chosen counters gained."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families


class Snapshot(NamedTuple):
    routed: dict[str, Counter[str]]  # server -> reason -> requests, from the gateway
    prefix: dict[str, tuple[float, float]]  # server -> (hits, queries), from the server


def _samples(url: str) -> list[Any]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def snapshot(gateway: str, servers: list[str]) -> Snapshot:
    routed: dict[str, Counter[str]] = {server: Counter() for server in servers}
    for sample in _samples(gateway):
        if sample.name == "semgate_upstream_requests_total":
            routed.setdefault(sample.labels["upstream"], Counter())[sample.labels["reason"]] += int(
                sample.value
            )
    prefix: dict[str, tuple[float, float]] = {}
    for server in servers:
        sums = Counter[str]()
        for sample in _samples(server):
            if sample.name in (
                "semgate_prefix_cache_hits_total",
                "semgate_prefix_cache_queries_total",
            ):
                sums[sample.name] += sample.value
        prefix[server] = (
            sums["semgate_prefix_cache_hits_total"],
            sums["semgate_prefix_cache_queries_total"],
        )
    return Snapshot(routed, prefix)


def between(before: Snapshot, after: Snapshot) -> dict[str, dict[str, Any]]:
    """Per server: requests routed to it in between (in all, by reason, as a share of
    the side's) and its prefix-cache hit rate over the prompt tokens it looked up."""
    sent = {s: after.routed[s] - before.routed.get(s, Counter()) for s in after.routed}
    total = sum(sum(c.values()) for c in sent.values())
    out = {}
    for server, reasons in sent.items():
        (hits_after, queries_after), (hits_before, queries_before) = (
            after.prefix[server],
            before.prefix[server],
        )
        hits, queries = hits_after - hits_before, queries_after - queries_before
        out[server] = {
            "requests": sum(reasons.values()),
            "share": sum(reasons.values()) / total if total else None,
            "by_reason": dict(sorted(reasons.items())),
            "prefix_cache_hit_rate": hits / queries if queries else None,
        }
    return out


def markdown(label: str, servers: dict[str, dict[str, Any]]) -> str:
    """One side's servers as a Markdown table."""
    rows = [
        f"| {label} | {name} | {s['requests']} | {_pct(s['share'])} | "
        + ", ".join(f"{r} {n}" for r, n in s["by_reason"].items() if n)
        + f" | {_pct(s['prefix_cache_hit_rate'])} |"
        for name, s in servers.items()
    ]
    return "\n".join(rows)


def table(sides: dict[str, dict[str, dict[str, Any]]]) -> str:
    head = (
        "| side | engine server | requests | share | chosen for | prefix-cache hit rate |\n"
        "|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(markdown(label, servers) for label, servers in sides.items())])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def counters(url: str, prefixes: tuple[str, ...]) -> dict[str, float]:
    """The server's counters, histogram sums and counts whose names start with one of
    `prefixes`, by `name{label="value",...}`."""
    out: dict[str, float] = {}
    for sample in _samples(url):
        if sample.name.startswith(prefixes) and sample.name.endswith(("_total", "_sum", "_count")):
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def counters_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each of `after`'s counters gained since `before` (a new one: all of it); those
    that did not move are left out."""
    moved = {name: value - before.get(name, 0.0) for name, value in after.items()}
    return {name: gain for name, gain in sorted(moved.items()) if gain}

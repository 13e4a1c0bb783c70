"""The engine servers behind a scenario side's gateway, from /metrics scraped before and
after the measured rounds: how many requests the gateway sent each (and why: its
`semgate_upstream_requests_total`), and the prefix-cache hit rate each reports (its own
`semgate_prefix_cache_hits_total` over `_queries_total`, prompt tokens)."""

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

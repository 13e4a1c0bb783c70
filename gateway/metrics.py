"""Prometheus metrics, named after vLLM's with a `semgate_` prefix. Request latencies
are observed by the gateway (labelled by model and cache status), the in-process
engine's request phases as its requests finish; engine gauges, the upstreams' health and
cache counters are read from their owners at scrape time, so they can never drift."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from litestar.types import Message, Scope
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cache import CacheStats
from cache.stats import SIMILARITY_BUCKETS
from engine import EngineStats, RequestMetrics
from engine.metrics import KV_TRANSFER_BUCKETS, KVTransferStats
from gateway.upstream import EngineGauges, UpstreamHealth
from gateway.upstream.balancer import REASONS

# A `_created` series beside every counter doubles what Prometheus stores for nothing
# it uses (vLLM turns them off too).
disable_created_metrics()

# Where the answers fall: cache hits in milliseconds (5, 10, 15, 20 ms), CPU TTFT and
# ITL between 0.1 and 0.25 s, and an e2e latency as long as the upstream timeout (600 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125,
                   0.15, 0.175, 0.2, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                   80.0, 160.0, 320.0, 640.0)  # fmt: skip
# The engine's request phases: vLLM's bounds (its request_latency_buckets, so that `le`
# selectors written for vLLM's histograms select the same here), and finer ones below
# its first, 0.3 s, where a CPU engine's queue and prefill times fall.
PHASE_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25,
                 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class CacheHealth(NamedTuple):
    up: bool  # Redis answers (and the cache has started)
    redis_restarts: int  # of the embedded Redis, after it exited
    circuit_open: bool = False  # Redis hangs: lookups time out, so the cache is skipped
    circuit_opens: int = 0


@dataclass(eq=False)  # the registry keys its collectors by identity
class _LiveCollector(Collector):
    """What /metrics reads at each scrape: the engine's gauges, the cache's stats and
    health, the upstreams' health, and the pass-throughs by reason."""

    gauges: Callable[[], EngineGauges | None]
    cache_stats: Callable[[], CacheStats | None]
    cache_health: Callable[[], CacheHealth | None]
    upstream_health: Callable[[], list[UpstreamHealth]]
    passed_through: Mapping[str, int]

    def collect(self) -> Iterator[Metric]:
        g = self.gauges()
        if g is not None:
            yield from _engine_metrics(g)
        yield from _upstream_metrics(self.upstream_health())
        health = self.cache_health()
        if health is not None:  # None: the cache is off
            yield GaugeMetricFamily(
                "semgate_cache_up", "1 while the cache's Redis answers, else 0.", int(health.up)
            )
            yield CounterMetricFamily(
                "semgate_cache_redis_restarts",
                "Restarts of the embedded Redis after it exited.",
                health.redis_restarts,
            )
            yield GaugeMetricFamily(
                "semgate_cache_circuit_open",
                "1 while the cache is skipped because lookups kept timing out on Redis.",
                int(health.circuit_open),
            )
            yield CounterMetricFamily(
                "semgate_cache_circuit_opens",
                "Times the cache's circuit breaker opened (consecutive Redis timeouts).",
                health.circuit_opens,
            )
        s = self.cache_stats()
        yield _bypasses(self.passed_through, s)
        if s is None:
            return
        for name, doc, value in (
            ("lookups", "Semantic-cache lookups.", s.lookups),
            ("misses", "Lookups that found no servable entry.", s.misses),
            ("coalesced", "Misses that waited for an equivalent request in flight.", s.coalesced),
            ("guard_rejections", "Lookups where the guard rejected a candidate.",
             s.guard_rejections),
            ("stores", "Answers stored.", s.stores),
        ):  # fmt: skip
            yield CounterMetricFamily(f"semgate_cache_{name}", doc, value)
        for name, doc, label, counts in (
            ("hits", "Cache hits by tier (exact, semantic-english, semantic-multilingual).",
             "tier", s.hits_by_tier),
            ("errors", "Cache failures (served as misses) by kind.", "kind", s.errors),
            ("guard_rejections_by_rule", "Candidates the guard rejected, by the rule that fired.",
             "rule", s.rejections_by_rule),
        ):  # fmt: skip
            family = CounterMetricFamily(f"semgate_cache_{name}", doc, labels=[label])
            for key, count in sorted(counts.items()):
                family.add_metric([key], count)
            yield family
        yield _similarity_histogram(s)
        yield from _saved(s)


def _saved(s: CacheStats) -> Iterator[Metric]:
    """What hits saved, by tenant and model. Tenants are the configured keys' (or
    `default` on the open gateway): a bounded label, never a client's free text."""
    labels = ["tenant", "model_name"]
    tokens = CounterMetricFamily(
        "semgate_cache_saved_tokens",
        "Tokens that cache hits did not generate: the stored answers' completion tokens.",
        labels=labels,
    )
    seconds = CounterMetricFamily(
        "semgate_cache_saved_seconds",
        "Seconds of generation that cache hits did not spend: the time each stored answer "
        "took upstream, for those whose time is known.",
        labels=labels,
    )
    for (tenant, model), saved in sorted(s.saved.items()):
        tokens.add_metric([tenant, model], saved.completion_tokens)
        seconds.add_metric([tenant, model], saved.seconds)
    yield from (tokens, seconds)


def _bypasses(passed_through: Mapping[str, int], s: CacheStats | None) -> Metric:
    """Requests kept away from the cache, by reason: each pass-through's (tools, n, ...:
    cache/policy.py), and `cache` for the cache's own (its policy, or Redis down)."""
    family = CounterMetricFamily(
        "semgate_cache_bypasses", "Requests kept away from the cache, by reason.", labels=["reason"]
    )
    if s is not None:
        family.add_metric(["cache"], s.bypasses)
    for reason, count in sorted(passed_through.items()):
        family.add_metric([reason], count)
    return family


def _engine_metrics(g: EngineGauges) -> Iterator[Metric]:
    """The in-process engine's gauges and counters, labelled with its model (vLLM's
    `model_name`)."""
    s = g.stats or EngineStats()  # a core that is down has no load: zeros
    for kind, name, doc, value in (
        (GaugeMetricFamily, "num_requests_running", "Requests in the engine's running batch.",
         s.num_running),
        (GaugeMetricFamily, "num_requests_waiting", "Requests waiting for the engine.",
         s.num_waiting),
        (GaugeMetricFamily, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use.",
         s.kv_cache_usage),
        (CounterMetricFamily, "prefix_cache_queries",
         "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
        (CounterMetricFamily, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
         s.prefix_cache_hits),
        (CounterMetricFamily, "num_preemptions",
         "Running requests sent back to wait when KV blocks ran out.", s.num_preemptions),
    ):  # fmt: skip
        family = kind(f"semgate_{name}", doc, labels=["model_name"])
        family.add_metric([g.model], value)
        yield family
    restarts = CounterMetricFamily(
        "semgate_engine_core_restarts",
        "Restarts of the engine's core process, by cause: it exited, or it hung (no "
        "progress with requests pending).",
        labels=["model_name", "cause"],
    )
    for cause in ("exited", "hung"):
        restarts.add_metric([g.model, cause], g.core_restarts.get(cause, 0))
    yield restarts
    if s.spec_method is not None:
        yield from _spec_metrics(g.model, s.spec_method, s)
    if s.kv_transfer is not None:
        yield from _kv_transfer_metrics(g.model, s.kv_transfer)


def _kv_transfer_metrics(model: str, kv: KVTransferStats) -> Iterator[Metric]:
    """The KV store's traffic (engine/kv_connector.py): tokens saved and loaded, tokens
    whose transfer failed by reason (computed instead, or left unsaved), and how long
    loads and saves took."""
    tokens = CounterMetricFamily(
        "semgate_kv_transfer_tokens",
        "Tokens whose KV was saved to or loaded from the KV store.",
        labels=["model_name", "direction"],
    )
    tokens.add_metric([model, "saved"], kv.saved_tokens)
    tokens.add_metric([model, "loaded"], kv.loaded_tokens)
    failures = CounterMetricFamily(
        "semgate_kv_transfer_failures",
        "Tokens whose KV could not be loaded (computed instead) or saved, by reason: "
        "missing, truncated, header, checksum, timeout, unavailable, save_dropped.",
        labels=["model_name", "reason"],
    )
    for reason, count in sorted(kv.failures.items()):
        failures.add_metric([model, reason], count)
    yield from (tokens, failures)
    for name, what, histogram in (
        ("load", "A request's load of its blocks", kv.load_seconds),
        ("save", "A step's save of its new full blocks", kv.save_seconds),
    ):
        buckets = _cumulative(KV_TRANSFER_BUCKETS, histogram.counts)
        family = HistogramMetricFamily(
            f"semgate_kv_{name}_seconds",
            f"{what} from or to the KV store, in seconds.",
            labels=["model_name"],
        )
        family.add_metric([model], buckets, histogram.total)
        yield family


def _upstream_metrics(servers: list[UpstreamHealth]) -> Iterator[Metric]:
    """Each server answering misses: up or down and, for remote engines that export
    them, their running and waiting requests; for remote servers, this gateway's requests
    in flight on them and those it sent them by reason (every family always described, so
    dashboards name them whatever the mode)."""
    up = GaugeMetricFamily(
        "semgate_upstream_up",
        "1 while the upstream (a remote server's base URL, or in-process) can answer.",
        labels=["upstream"],
    )
    counts = {
        kind: GaugeMetricFamily(
            f"semgate_upstream_num_requests_{kind}",
            f"A remote upstream's {kind} requests, from its own /metrics.",
            labels=["upstream"],
        )
        for kind in ("running", "waiting")
    }
    in_flight = GaugeMetricFamily(
        "semgate_upstream_in_flight",
        "This gateway's requests in flight on a remote upstream.",
        labels=["upstream"],
    )
    chosen = CounterMetricFamily(
        "semgate_upstream_requests",
        "Requests sent to a remote upstream, by why routing chose it: prefix, load, session "
        "or fallback.",
        labels=["upstream", "reason"],
    )
    for server in servers:
        up.add_metric([server.name], int(server.up))
        for kind, family in counts.items():
            if (count := getattr(server, kind)) is not None:
                family.add_metric([server.name], count)
        if server.policy is not None:  # a remote server: routing chooses it
            in_flight.add_metric([server.name], server.in_flight)
            for reason in REASONS:
                chosen.add_metric([server.name, reason], server.requests.get(reason, 0))
    yield from (up, *counts.values(), in_flight, chosen)


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, int]]:
    """Prometheus's cumulative buckets from counts per bucket, the +Inf one last (a count
    past the bounds is what lies above the last bound)."""
    running = list(itertools.accumulate(counts))
    return [(str(b), c) for b, c in zip(bounds, running, strict=False)] + [("+Inf", running[-1])]


def _similarity_histogram(s: CacheStats) -> Metric:
    """The best candidate's similarity on each semantic lookup, as a histogram (the last
    bound is 1.0: nothing lies above it)."""
    buckets = _cumulative(SIMILARITY_BUCKETS, s.similarity_counts)
    return HistogramMetricFamily(
        "semgate_cache_best_similarity",
        "Similarity of the best candidate of each semantic lookup.",
        buckets=buckets,
        sum_value=s.similarity_sum,
    )


def _spec_metrics(model: str, method: str, s: EngineStats) -> Iterator[Metric]:
    """vLLM's spec_decode counters, labelled by method; rates follow from them."""
    for name, doc, value in (
        ("num_drafts", "Verifications of at least one proposed token.", s.spec_num_drafts),
        ("num_draft_tokens", "Tokens proposed.", s.spec_draft_tokens),
        ("num_accepted_tokens", "Proposed tokens accepted.", s.spec_accepted_tokens),
    ):
        family = CounterMetricFamily(
            f"semgate_spec_decode_{name}", doc, labels=["model_name", "method"]
        )
        family.add_metric([model, method], value)
        yield family


class GatewayMetrics:
    """One registry per app, so several apps (tests) never share counters."""

    def __init__(
        self,
        gauges: Callable[[], EngineGauges | None],
        cache_stats: Callable[[], CacheStats | None],
        cache_health: Callable[[], CacheHealth | None],
        upstream_health: Callable[[], list[UpstreamHealth]],
    ) -> None:
        self.registry = CollectorRegistry()
        # Requests passed through to the upstreams, by reason (gateway/passthrough.py).
        self.passed_through: collections.Counter[str] = collections.Counter()
        labels = ["model_name", "cache_status"]
        self.ttft = Histogram(
            "semgate_time_to_first_token_seconds",
            "Time from request arrival to the first content token.",
            labels,
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.itl = Histogram(
            "semgate_inter_token_latency_seconds",
            "Time between consecutive content chunks of a streamed answer.",
            labels,
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.e2e = Histogram(
            "semgate_e2e_request_latency_seconds",
            "Time from request arrival to the last byte of the answer.",
            labels,
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        # vLLM's request phases, observed as each in-process engine request finishes
        # (remote engines export their own).
        self.phases = {
            phase: Histogram(
                f"semgate_request_{phase}_time_seconds",
                doc,
                ["model_name"],
                registry=self.registry,
                buckets=PHASE_BUCKETS,
            )
            for phase, doc in (
                ("queue", "Time a request waited for the engine: arrival to first scheduled."),
                ("prefill", "Time from a request's first scheduling to its first token."),
                ("decode", "Time from a request's first token to its last."),
                ("inference", "Time from a request's first scheduling to its last token."),
            )
        }
        self.requests = Counter(
            "semgate_requests",
            "Chat requests answered, by model, cache status and finish reason.",
            ["model_name", "cache_status", "finish_reason"],
            registry=self.registry,
        )
        self.early_starts = Counter(
            "semgate_early_starts",
            "Engine requests started while the cache was asked: used on a miss, or aborted "
            "on a hit (or for an equivalent request already in flight).",
            ["outcome"],
            registry=self.registry,
        )
        self.http_requests = Counter(
            "semgate_http_requests",
            "HTTP responses, by route (its template: /admin/cache/entries/{entry_id}) and "
            "status; `unmatched` for paths no route serves.",
            ["path", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "semgate_prompt_tokens",
            "Prompt tokens processed upstream.",
            ["model_name"],
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            "semgate_generation_tokens",
            "Tokens generated upstream.",
            ["model_name"],
            registry=self.registry,
        )
        self.http_refusals = Counter(
            "semgate_http_refusals",
            "Requests refused before they reached the app, by reason: header_size (too "
            "large or too many), header_timeout, body_timeout, connections (too many), "
            "malformed (the parser could not read it).",
            ["reason"],
            registry=self.registry,
        )
        self.pd_requests = Counter(
            "semgate_pd_requests",
            "Requests to decode servers that have prefill servers, by where their prompt was "
            "prefilled (route: remote, on a prefill server, or local, on the decode server) "
            "and why (gateway/upstream/disaggregation.py's reasons).",
            ["model_name", "route", "reason"],
            registry=self.registry,
        )
        self.registry.register(
            _LiveCollector(gauges, cache_stats, cache_health, upstream_health, self.passed_through)
        )

    def count_pd(self, model: str, route: str, reason: str) -> None:
        self.pd_requests.labels(model, route, reason).inc()

    def count_refusal(self, reason: str) -> None:
        self.http_refusals.labels(reason).inc()

    def observe_engine_request(self, model: str, m: RequestMetrics) -> None:
        """A finished in-process engine request's phases (those it went through)."""
        for phase, seconds in (
            ("queue", m.queue_time),
            ("prefill", m.prefill_time),
            ("decode", m.decode_time),
            ("inference", m.inference_time),
        ):
            if seconds is not None:
                self.phases[phase].labels(model).observe(seconds)


async def count_response(message: Message, scope: Scope) -> None:
    """A `before_send` hook (it sees every response, routed or not): one count each."""
    if message["type"] != "http.response.start":
        return
    metrics: GatewayMetrics = scope["app"].state.runtime.metrics
    path = scope.get("path_template") or "unmatched"
    metrics.http_requests.labels(path, str(message["status"])).inc()

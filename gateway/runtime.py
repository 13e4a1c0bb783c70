"""The gateway's resources: upstream (engine or remote servers), semantic cache,
keys, metrics. Started in the app's lifespan, in the background, so the port answers
(/health 200, /ready 503) while the model loads; chat waits for nothing it does not
need: while Redis is not up (starting, or down and being restarted), requests are
served uncached (fail open), and /ready says so without turning 503."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import time
from contextlib import AsyncExitStack
from typing import Any, Literal

from cache import CachePolicy, CacheRuntime, SemanticCache, Thresholds
from cache.runtime import ModelNotLoaded
from cache.shared_admin import SharedAdmin
from cache.supervisor import RedisSupervisor
from gateway.auth import Keyring, write_key_file
from gateway.chat_service import ChatService
from gateway.drain import SHUTTING_DOWN, Drain
from gateway.embeddings import EmbeddingService
from gateway.errors import APIError
from gateway.metrics import CacheHealth, GatewayMetrics
from gateway.passthrough import PassThrough
from gateway.settings import Settings
from gateway.upstream import HttpUpstream, InProcessEngine, ModelRouter, Upstream
from gateway.upstream.disaggregation import Disaggregated, PdRule
from resilience.circuit_breaker import CircuitBreaker
from resilience.redis_url import redacted

log = logging.getLogger("semgate.gateway")

CACHE_RETRY_SECONDS = (1, 2, 5, 10, 30)
STORE_DRAIN_SECONDS = 5.0  # at shutdown, for answers still being written to the cache


def build_upstream(settings: Settings, metrics: GatewayMetrics) -> ModelRouter:
    """Whatever serves each model: the in-process engine first (its model is the
    default), then the upstream groups, then the upstreams whose models are discovered."""
    targets: list[Upstream] = []
    if settings.runs_engine:
        engine = settings.engine
        targets.append(
            InProcessEngine(
                engine.config(),
                max_waiting=engine.max_waiting,
                observe=metrics.observe_engine_request,
                hang_seconds=engine.hang_timeout,
            )
        )

    rule = PdRule(
        settings.pd_min_prompt_tokens, settings.pd_max_prefill_queue, settings.pd_failure_backoff
    )

    def remote(urls: list[str], prefill: list[str], model: str | None = None) -> Upstream:
        """The servers of `model` (None: those whose models are discovered); with prefill
        servers, those decode. Both pools take the group's settings (the weights, one per
        URL, are the decode servers'; a prefill's time is bounded by pd_prefill_timeout)."""
        group = settings.group(model)

        # HttpUpstream's settings: both pools', then the decode servers' own.
        shared: dict[str, Any] = {
            "api_key": group.api_key, "model": model, "balancer": group.balancer
        }  # fmt: skip
        decode: dict[str, Any] = {"timeout": group.timeout, "weights": group.weights, **shared}
        if not prefill:
            return HttpUpstream(urls, **decode)
        timeout = min(group.timeout, settings.pd_prefill_timeout)
        prefilling = HttpUpstream(prefill, timeout=timeout, **shared)
        return Disaggregated(urls, prefilling, rule, metrics.count_pd, **decode)

    prefill = settings.upstream_prefill_groups
    targets += [
        remote(urls, prefill.get(model, []), model)
        for model, urls in settings.upstream_groups.items()
    ]
    if settings.upstreams:
        targets.append(remote(settings.upstreams, settings.upstream_prefill))
    return ModelRouter(targets, settings.model_aliases)


class Runtime:
    def __init__(self, settings: Settings, upstream: Upstream | None = None) -> None:
        self.settings = settings
        self.keyring = Keyring(settings.api_keys, settings.admin_key)
        self.cache_on = settings.cache
        self.cache: SemanticCache | None = None
        self.redis: RedisSupervisor | None = None  # set with `cache`
        self.shared: SharedAdmin | None = None  # thresholds and stats across replicas
        # Before the upstream, which observes its requests' phases into it; it reads the
        # upstream only when scraped.
        self.metrics = GatewayMetrics(
            lambda: self.upstream.gauges(),
            lambda: self.cache.stats if self.cache else None,
            self.cache_health,
            lambda: self.upstream.health(),
        )
        self.upstream = (
            build_upstream(settings, self.metrics) if upstream is None else ModelRouter([upstream])
        )
        self.engine = next(
            (t for t in self.upstream.targets if isinstance(t, InProcessEngine)), None
        )
        self.drain = Drain(settings.shutdown_grace, self._end_in_flight)
        # Replicas can only share an external Redis: an embedded one is this process's.
        shared = settings.redis_url is not None
        self.chat = ChatService(
            self.upstream, None, self.metrics, settings.early_start, shared,
            settings.default_max_tokens or None,
        )  # fmt: skip
        # Remote servers answer what the cache cannot key (PassThrough.serves); the
        # in-process engine refuses it.
        self.passthrough = (
            PassThrough(self.upstream, self.metrics, settings.upstream_header)
            if self.upstream.forwards
            else None
        )
        # One embedder for /v1/embeddings and the cache (which borrows it at its start).
        self.embeddings = EmbeddingService()
        self.started = int(time.time())
        # Why each part is not up yet (shown by /ready), kept apart so that one part
        # coming up never hides the other's failure.
        self.upstream_failure: str | None = None
        self.cache_failure: str | None = None
        self._stack = AsyncExitStack()
        self._task: asyncio.Task[None] | None = None

    @property
    def cache_state(self) -> Literal["up", "down", "off"]:
        if not self.cache_on:
            return "off"
        return "up" if self.cache is not None and self.cache.down_reason is None else "down"

    def cache_down_reason(self) -> str | None:
        """Why the cache is down (starting, failing to start, Redis down or hanging);
        None if not."""
        if self.cache_state != "down":
            return None
        if self.cache is not None:
            return self.cache.down_reason
        return self.cache_failure or "starting Redis and the embedder"

    def cache_health(self) -> CacheHealth | None:
        if not self.cache_on:
            return None
        restarts = self.redis.restarts if self.redis is not None else 0
        breaker = self.cache.breaker if self.cache is not None else None
        return CacheHealth(
            self.cache_state == "up",
            restarts,
            breaker is not None and breaker.open,
            breaker.opens if breaker is not None else 0,
        )

    def context_length(self, model: str) -> int | None:
        """The context length of `model` (a public name: an alias is its target) where
        this gateway runs it, once loaded; else None (a remote server says its own)."""
        engine = self.engine
        if engine is None or engine.llm is None or self.upstream.route(model) != engine.model_id:
            return None
        return engine.max_model_len

    def alive_failure(self) -> str | None:
        """Why this process cannot mend itself (/health 503: a liveness probe should
        restart it), else None."""
        if self.engine is not None and self.engine.broken:
            return f"the engine core cannot be restarted: {self.engine.failure}"
        return None

    def check_accepting(self) -> None:
        """503 once a shutdown has begun: new requests belong to another replica."""
        if self.drain.draining:
            raise APIError(
                503,
                f"{SHUTTING_DOWN}; retry on another replica",
                "service_unavailable",
                "shutting_down",
                retry_after=1,
            )

    def check_ready(self) -> None:
        """503 with Retry-After while no model or upstream can answer, or the server is
        shutting down. The cache never holds chat up: without it, requests are answered
        uncached."""
        self.check_accepting()
        if self.upstream.ready():
            return
        raise APIError(
            503,
            f"not ready: {self.waiting_for()}",
            "service_unavailable",
            "not_ready",
            retry_after=2,
        )

    def waiting_for(self) -> str:
        what = self.upstream.awaited
        failures = [f for f in (self.upstream_failure, self.upstream.failure) if f]
        return f"{what} ({'; '.join(failures)})" if failures else f"starting {what}"

    def announce(self) -> None:
        if self.keyring.open:
            log.warning("no API keys configured: chat is open to anyone who can reach this port")
        else:
            log.info("%d API key(s) for %d tenant(s)", len(self.keyring.api_keys),
                     len(set(self.keyring.api_keys.values())))  # fmt: skip
        if self.keyring.admin_key is None:
            log.info("no admin key: the admin API is off")
        elif self.keyring.generated_admin_key:
            # Keys never go to logs: the operator reads it from a file only they can read,
            # which goes with the run.
            path = write_key_file(self.keyring.admin_key)
            self._stack.callback(path.unlink, missing_ok=True)
            log.info("admin key for this run written to %s (readable by this user only)", path)

    async def start(self) -> None:
        """Starts loading in the background and returns at once."""
        self.announce()
        self._task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        await asyncio.gather(self._start_upstream(), self._start_cache())
        # What start-up loaded (the embedder, tokenizers, the guard's word lists: some
        # 500,000 objects) lives as long as the process. Frozen out of the garbage
        # collector, whose full passes over it took 200-300 ms each, during which nothing
        # else ran on the event loop (one showed up in a profile of a 300-request burst).
        # Not collected first: a full pass now would be just such a stall.
        gc.freeze()

    async def _start_upstream(self) -> None:
        t0 = time.perf_counter()
        what = self.upstream.description
        log.info("loading %s: %s", what, ", ".join(self.upstream.models()) or "(listed on start)")
        try:
            await self.upstream.start()
        except Exception as exc:
            self.upstream_failure = f"{what} failed to start: {exc}"
            log.error("%s", self.upstream_failure)
            return
        served = ", ".join(self.upstream.models())
        log.info("loaded %s in %.1f s, serving %s", what, time.perf_counter() - t0, served)
        # Ready means chat is answered (remote upstreams may all be down yet); the cache
        # comes up, or not, on its own.
        if self.upstream.ready():
            log.info("ready: http://%s:%d", self.settings.host, self.settings.port)

    async def _start_cache(self) -> None:
        if not self.cache_on:
            log.info("cache off: every request goes to the upstream")
            return
        s = self.settings
        for attempt in itertools.count():
            t0 = time.perf_counter()
            runtime = CacheRuntime(
                redis_url=s.redis_url,
                data_dir=s.redis_data_dir,
                maxmemory=s.redis_maxmemory,
                max_connections=s.redis_max_connections,
                embedder=self.embeddings.embedder,  # lent: /v1/embeddings serves it too
                thresholds=Thresholds(s.threshold, dict(s.model_thresholds),
                                      dict(s.tenant_thresholds)),
                policy=CachePolicy(max_temperature=s.cache_max_temperature),
                default_ttl=s.cache_ttl,
                breaker=CircuitBreaker(s.cache_breaker_after, s.cache_breaker_backoff),
            )  # fmt: skip
            try:
                self.cache = await self._stack.enter_async_context(runtime)
            except ModelNotLoaded as exc:
                self.cache_failure = f"cache start failed: {exc}"
                log.error("%s (serving uncached)", self.cache_failure)
                return
            except Exception as exc:
                delay = CACHE_RETRY_SECONDS[min(attempt, len(CACHE_RETRY_SECONDS) - 1)]
                self.cache_failure = f"cache start failed, retrying in {delay} s: {exc}"
                log.error("%s (serving uncached meanwhile)", self.cache_failure)
                await asyncio.sleep(delay)
                continue
            self.cache_failure = None
            self.redis = runtime.supervisor
            self.shared = SharedAdmin(
                self.cache.store.client,
                self.cache,
                lambda: {"pending_stores": self.chat.pending_stores},
            )
            await self.shared.start()
            self.chat.cache = self.cache
            server = runtime.server  # None when given a URL
            where = (
                f"embedded Redis Stack at {server.url}" if server else redacted(s.redis_url or "")
            )
            took = ", ".join(f"{name} {t:.2f} s" for name, t in runtime.load_times.items())
            log.info("cache ready in %.1f s (%s): %s", time.perf_counter() - t0, took, where)
            return

    async def _end_in_flight(self) -> None:
        """Ends the requests still running when the shutdown grace is over: closing what
        answers them fails each cleanly (an SSE error event and [DONE], or a 503)."""
        if self.engine is not None:
            await self.engine.close(SHUTTING_DOWN)
        await self.upstream.close()

    async def close(self) -> None:
        await self.drain.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        # Answers already on their way into the cache are kept; new requests (if any
        # still arrive) no longer use it.
        await self.chat.drain_stores(timeout=STORE_DRAIN_SECONDS)
        self.chat.cache = None
        if self.shared is not None:
            await self.shared.stop()
        await self._stack.aclose()
        self.embeddings.close()
        await self.upstream.close()

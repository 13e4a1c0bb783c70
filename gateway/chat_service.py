"""The chat service: the request path behind POST /v1/chat/completions, free of HTTP
framing, as one straight pipeline:

    translate (job, cache request) -> can the upstream serve it? (400 if not)
    -> may the cache answer it? (Bypass if not: the upstream, uncached)
    -> lookup -> hit: replay
              -> miss: coalesce -> follow an equivalent answer in flight, or
                 produce it: the upstream's stream, teed to the client and stored.

Every answer, hit or miss, is an async stream of `Delta`s ending with one delta that
carries finish_reason and usage; the route renders it as JSON or SSE.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace
from functools import partial

import msgspec

from cache import (
    Bypass,
    CacheRequest,
    CompletionOutcome,
    FlightError,
    FlightLost,
    LookupResult,
    SemanticCache,
)
from gateway import server_timing
from gateway.cache_directives import CacheDirectives
from gateway.early_start import EarlyStart
from gateway.errors import UNSUPPORTED, APIError
from gateway.job_translation import cache_request, chat_job, structure_size
from gateway.metrics import GatewayMetrics
from gateway.off_loop import run_sized
from gateway.replay import final_delta, hit_headers, servable
from gateway.schemas import ChatCompletionRequest
from gateway.upstream import CompletionJob, Delta, ModelRouter

log = logging.getLogger("semgate.gateway")

# Flights are shared with other gateway processes through Redis as JSON deltas.
DELTA_CODEC = (msgspec.json.encode, partial(msgspec.json.decode, type=Delta))


@dataclass
class Answer:
    """An answer ready to render. `deltas` already holds the first delta for misses, so
    refusals (context length, queue full) surface before any response is sent."""

    id: str
    model: str
    created: int
    cache_status: str  # "hit" | "miss" | "bypass"
    deltas: AsyncGenerator[Delta, None]
    headers: dict[str, str] = field(default_factory=dict)
    # Known as the response starts (a stream's Server-Timing): the gateway's own timings
    # and the first delta's. The final delta carries them all.
    timings: server_timing.Timings = field(default_factory=dict)
    upstream: str | None = None  # the remote server answering, where one does


class ChatService:
    def __init__(
        self,
        upstream: ModelRouter,
        cache: SemanticCache | None,
        metrics: GatewayMetrics,
        early_start: bool = True,
        share_flights: bool = False,
        default_max_tokens: int | None = None,
    ) -> None:
        self.upstream = upstream
        self.cache = cache
        self.metrics = metrics
        # Start the upstream while the cache is asked, where a hit aborts it cheaply
        # (against remote upstreams every hit would cost them a request).
        self.early_start = early_start
        # Coalesce with other gateway processes through Redis (costs a few round trips
        # per miss, so only where other replicas can share the Redis).
        self.codec = DELTA_CODEC if share_flights else None
        # What an answer whose request sets no max_tokens is cut at (None: the context).
        self.default_max_tokens = default_max_tokens
        self._stores: set[asyncio.Task[object]] = set()

    def _servable(self, job: CompletionJob) -> CompletionJob:
        """`job` as its upstream can run it: a 400 naming the field it cannot honour, or
        for a prompt it can tell will not fit (before the cache does any work on it)."""
        if (found := self.upstream.supports(job)) is not None:
            raise APIError(400, found.message, param=found.param, code=UNSUPPORTED)
        self.upstream.refuse_oversized(job)
        return job

    def _translated(
        self,
        request: ChatCompletionRequest,
        answer_id: str,
        model: str,
        tenant: str,
        trace_id: str | None,
        session: str | None,
    ) -> tuple[CompletionJob, CacheRequest, Bypass | None]:
        """The request as its upstream runs it (checked: `_servable`), as the cache keys
        it, and what in it the cache cannot key: read here, where a long conversation is
        off the event loop (it walks every message); the lookup and the store read the
        same verdict (CacheRequest.unkeyable keeps it)."""
        job = chat_job(
            request, answer_id, model, tenant, self.default_max_tokens, trace_id, session
        )
        job = self._servable(job)
        asked = cache_request(job, tenant)
        return job, asked, asked.unkeyable

    async def answer(
        self,
        request: ChatCompletionRequest,
        tenant: str,
        directives: CacheDirectives,
        trace_id: str | None = None,
        session: str | None = None,
    ) -> Answer:
        """`trace_id`: the request's X-Request-Id, which remote servers are sent;
        `session`: its X-Session-Id (gateway/upstream/balancer.py)."""
        started = time.perf_counter()
        answer_id = f"chatcmpl-{uuid.uuid4().hex}"
        # The job, the cache's partition and the metrics name the served model (an
        # alias's target); the answer names the model the client asked for.
        model = self.upstream.route(request.model)
        translate = partial(
            self._translated, answer_id=answer_id, model=model, tenant=tenant,
            trace_id=trace_id, session=session,
        )  # fmt: skip
        # Off the event loop for many messages or parts (100,000 empty ones cost 50 ms).
        size = structure_size(request.messages)
        job, asked, unkeyable = await run_sized(translate, request, size)
        if self.cache is not None and unkeyable is not None:
            return replace(await self._uncached(job, unkeyable.reason), model=request.model)
        lookup: LookupResult | None = None
        early: EarlyStart | None = None
        own: server_timing.Timings = {}  # the gateway's own timings: cache, embed
        if self.cache is not None and directives.lookup:
            early_starts: list[EarlyStart] = []  # one, once the exact tier missed
            lookup = await self._lookup(asked, job, directives, early_starts, own)
            early = early_starts[0] if early_starts else None
            if lookup.hit is not None:
                await self._abort_early(early)
                deltas = final_delta(lookup.hit.entry, job, self.upstream)
                timed = self._timed(Delta(lookup.hit.entry.response), deltas, model, "hit",
                                    started, own)  # fmt: skip
                headers = hit_headers(lookup.hit)
                return Answer(answer_id, request.model, int(time.time()), "hit", timed, headers,
                              own)  # fmt: skip
        # "miss" means the cache was asked (a failed lookup is a miss: fail open).
        status = "miss" if lookup is not None and lookup.status != "bypass" else "bypass"
        # An answer cut at one of this request's stop sequences also ends with "stop",
        # but it is not the whole answer to the question: never store those.
        store = self.cache is not None and directives.store and not job.stop
        produce = partial(self._produce, job, early, asked, lookup, store, directives.ttl)
        headers = {}
        if status == "miss" and lookup is not None:
            deltas, followed = await self._coalesced(job, lookup, produce)
            if followed:
                headers["X-Cache-Coalesced"] = "true"
                await self._abort_early(early)  # the answer we follow does the work
        else:
            deltas = produce()
        first = await first_delta(deltas)  # raises the upstream's refusal as an APIError
        timed = self._timed(first, deltas, job.model, status, started, own)
        timings = server_timing.merge(own, first.timings)
        created = int(time.time())
        return Answer(
            answer_id, request.model, created, status, timed, headers, timings, first.upstream
        )

    async def _lookup(
        self,
        asked: CacheRequest,
        job: CompletionJob,
        directives: CacheDirectives,
        started: list[EarlyStart],
        own: server_timing.Timings,
    ) -> LookupResult:
        """The cache's answer to `asked`, with its timings in `own`. The upstream request
        starts early (into `started`) once the exact tier has missed: an exact hit costs
        the engine nothing and the gateway no request to build and abort (~0.7 ms of the
        event loop's), and a miss starts one Redis round trip later, while the question
        is embedded. An early start is aborted if the lookup fails."""
        assert self.cache is not None
        start_early = None
        if self.early_start and self.upstream.cheap_abort_of(job.model):
            start_early = partial(self._start_early, job, started)
        try:
            accept = partial(servable, job, directives.max_age)
            began = time.perf_counter()
            lookup = await self.cache.lookup(asked, accept=accept, exact_missed=start_early)
        except BaseException:
            await self._abort_early(started[0] if started else None)
            raise
        if lookup.status != "bypass":  # a policy bypass never asked the cache
            own["cache"] = (time.perf_counter() - began) * 1000
            if lookup.embed_seconds is not None:
                own["embed"] = lookup.embed_seconds * 1000
        return lookup

    def _start_early(self, job: CompletionJob, started: list[EarlyStart]) -> None:
        started.append(EarlyStart(self.upstream.stream(job)))

    async def _coalesced(
        self,
        job: CompletionJob,
        lookup: LookupResult,
        produce: partial[AsyncGenerator[Delta, None]],
    ) -> tuple[AsyncGenerator[Delta, None], bool]:
        """A miss's answer and whether it follows another request's: an equivalent answer
        in flight (here, or on another replica sharing the Redis), else its own."""
        assert self.cache is not None
        variant = (job.max_tokens, tuple(job.stop), job.ignore_eos)
        seat = await self.cache.coalescer.join(lookup, variant, self.codec)
        if not seat.feeds:
            return _followed(seat.answer()), True
        if seat.remote is not None:  # another replica leads: relayed to this one's
            return _followed(seat.feed(relayed(seat.remote, produce))), True
        return seat.feed(produce()), False

    async def uncached(self, job: CompletionJob, reason: str) -> Answer:
        """`job` (a text completion) on the upstream, never looked up nor stored."""
        return await self._uncached(self._servable(job), reason)

    async def _uncached(self, job: CompletionJob, reason: str) -> Answer:
        """`job` on the upstream, never looked up nor stored (text completions, and what
        the cache cannot key): a bypass by `reason`, observed for /metrics as any answer."""
        started = time.perf_counter()
        self.metrics.passed_through[reason] += 1
        deltas = self._counted(self.upstream.stream(job), job.model)
        first = await first_delta(deltas)  # raises the upstream's refusal as an APIError
        timed = self._timed(first, deltas, job.model, "bypass", started, {})
        timings = dict(first.timings or {})
        headers = {"X-Cache-Bypass-Reason": reason}
        return Answer(
            job.request_id, job.model, int(time.time()), "bypass", timed, headers, timings
        )

    async def _counted(
        self, source: AsyncGenerator[Delta, None], model: str
    ) -> AsyncGenerator[Delta, None]:
        """`source`, its tokens counted for /metrics at its final delta."""
        try:
            async for delta in source:
                if delta.finish_reason is not None:
                    self.metrics.prompt_tokens.labels(model).inc(delta.prompt_tokens or 0)
                    self.metrics.generation_tokens.labels(model).inc(delta.completion_tokens or 0)
                yield delta
        finally:
            await source.aclose()  # leaving early aborts it

    async def _abort_early(self, early: EarlyStart | None) -> None:
        if early is not None:
            await early.cancel()
            self.metrics.early_starts.labels("aborted").inc()

    @property
    def pending_stores(self) -> int:
        """Answers still being written to the cache (they finish after their response)."""
        return len(self._stores)

    async def drain_stores(self, timeout: float) -> None:
        """Waits (up to `timeout` seconds) for answers still being stored: at shutdown,
        before Redis is closed under them."""
        if self._stores:
            await asyncio.wait(set(self._stores), timeout=timeout)

    async def _produce(
        self,
        job: CompletionJob,
        early: EarlyStart | None,
        asked: CacheRequest,
        lookup: LookupResult | None,
        store: bool,
        ttl: int | None,
    ) -> AsyncGenerator[Delta, None]:
        """The upstream's answer, teed into the cache. The store starts in the background
        as the final delta arrives, before it is handed on: the client's response ends
        without waiting for Redis, and a consumer that stops at the final delta cannot
        cancel the store. Inside a flight the flight also waits for the store, so
        requests arriving after it hit the cache instead of starting again. The answer is
        stored with the seconds from the upstream request to its final delta."""
        # The early start, unless it was given up for a flight that then got lost, or
        # turned away while other requests' early starts held the queue.
        if early is not None and not early.cancelled and not early.turned_away:
            self.metrics.early_starts.labels("used").inc()
            source, sent = early.deltas(), early.sent
        else:
            source, sent = self.upstream.stream(job), time.perf_counter()
        counted = self._counted(source, job.model)
        parts: list[str] = []
        stored: asyncio.Task[object] | None = None
        try:
            async for delta in counted:
                parts.append(delta.text)
                if delta.finish_reason is not None and store:
                    seconds = time.perf_counter() - sent
                    stored = self._store(delta, "".join(parts), seconds, asked, lookup, ttl)
                yield delta
        finally:
            await counted.aclose()  # leaving early aborts the upstream request
        if stored is not None:
            await asyncio.shield(stored)

    def _store(
        self,
        final: Delta,
        text: str,
        seconds: float,
        asked: CacheRequest,
        lookup: LookupResult | None,
        ttl: int | None,
    ) -> asyncio.Task[object]:
        """Starts storing the answer (policy permitting), with its usage and `seconds`,
        how long the upstream took to produce it."""
        assert self.cache is not None
        counts = {
            "prompt_tokens": final.prompt_tokens,
            "completion_tokens": final.completion_tokens,
        }
        usage = {name: n for name, n in counts.items() if n is not None}
        # What a hit on it will save (CacheEntry.generation_seconds), to 0.1 ms.
        metadata = {**usage, "generation_seconds": round(seconds, 4)}
        outcome = CompletionOutcome(text, final.finish_reason)
        task = asyncio.get_running_loop().create_task(
            self.cache.store_answer(asked, outcome, lookup, ttl, metadata)
        )
        # The loop holds tasks weakly: keep each store alive until it is done.
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)
        return task

    async def _timed(
        self,
        first: Delta,
        rest: AsyncGenerator[Delta, None],
        model: str,
        status: str,
        started: float,
        own: server_timing.Timings,
    ) -> AsyncGenerator[Delta, None]:
        """`first`, then `rest`, observing TTFT, ITL and e2e for /metrics on the way. Ends
        at the final delta (what follows it upstream, such as storing the answer, is no
        concern of this client), which leaves with every timing: `own` (the gateway's)
        and the upstream's. Closing it closes `rest`, which aborts the upstream request
        or leaves the flight."""
        labels = (model, status)
        last: float | None = None
        finish = "abort"
        delta: Delta | None = first
        try:
            while delta is not None:
                now = time.perf_counter()
                if delta.text:
                    if last is None:
                        self.metrics.ttft.labels(*labels).observe(now - started)
                    else:
                        self.metrics.itl.labels(*labels).observe(now - last)
                    last = now
                if delta.finish_reason is not None:
                    timings = server_timing.merge(own, delta.timings)
                    delta = replace(delta, timings=timings or None)
                yield delta
                if delta.finish_reason is not None:
                    finish = delta.finish_reason
                    self.metrics.e2e.labels(*labels).observe(time.perf_counter() - started)
                    return
                delta = await anext(rest, None)
        finally:
            self.metrics.requests.labels(*labels, finish).inc()
            await rest.aclose()


async def _followed(deltas: AsyncGenerator[Delta, None]) -> AsyncGenerator[Delta, None]:
    """A followed answer, as its follower's. The upstream's timings are dropped: they are
    the leader's request's, which began before this one. A flight of another process
    reports its leader's failure as text only: the client gets it as an upstream error
    (502)."""
    try:
        async for delta in deltas:
            yield replace(delta, timings=None) if delta.timings is not None else delta
    except (FlightError, FlightLost) as exc:
        message = f"the answer this request followed failed: {exc}"
        raise APIError(502, message, "upstream_error") from exc
    finally:
        await deltas.aclose()


async def relayed(
    remote: AsyncGenerator[Delta, None], own: Callable[[], AsyncGenerator[Delta, None]]
) -> AsyncGenerator[Delta, None]:
    """Another replica's answer; lost before its first delta, `own()` answers instead
    (lost after, the loss is this stream's error)."""
    followed = False
    try:
        async for delta in remote:
            followed = True
            yield delta
        return
    except FlightLost as exc:
        if followed:
            raise
        log.warning("shared flight lost before its first delta, answering here: %s", exc)
    finally:
        await remote.aclose()
    stream = own()
    try:
        async for delta in stream:
            yield delta
    finally:
        await stream.aclose()


async def first_delta(deltas: AsyncGenerator[Delta, None]) -> Delta:
    try:
        return await anext(deltas)
    except StopAsyncIteration:
        raise APIError(502, "the upstream ended without an answer", "upstream_error") from None
    except BaseException:
        await deltas.aclose()
        raise

"""The request path behind POST /v1/chat/completions, free of HTTP framing:
validate -> cache policy -> lookup (exact, semantic, guard) -> hit: replay |
miss: single-flight -> upstream stream, teed -> store when complete.

Every answer, hit or miss, is an async stream of `Delta`s ending with one delta that
carries finish_reason and usage; the route renders it as JSON or SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import msgspec

from cache import (
    CacheRequest,
    CompletionOutcome,
    FlightError,
    FlightLost,
    LookupResult,
    SemanticCache,
)
from cache.store import CacheEntry, Candidate
from gateway import server_timing
from gateway.auth import OPEN_TENANT
from gateway.bypass import unkeyable
from gateway.early_start import EarlyStart
from gateway.errors import UNSUPPORTED, APIError
from gateway.metrics import GatewayMetrics
from gateway.off_loop import INLINE_CHARS, MESSAGE_CHARS, run_sized
from gateway.request_fields import sampling_given
from gateway.schemas import ChatCompletionRequest, ChatMessage, TextMessage
from gateway.tokens import token_counter
from gateway.upstream import ChatJob, Delta, ForwardedJob, ModelRouter

# Flights are shared with other gateway processes through Redis as JSON deltas.
DELTA_CODEC = (msgspec.json.encode, partial(msgspec.json.decode, type=Delta))


@dataclass(frozen=True)
class CacheDirectives:
    """What the request allows, as HTTP caching reads a request's Cache-Control:
    `no-cache` skips the lookup (the answer is still stored), `no-store` skips both, and
    `max-age=N` accepts only cached answers at most N seconds old (0: none). How long the
    answer is kept is not Cache-Control's to say: `ttl` comes from the body's
    `cache: {"ttl": N}` (as LiteLLM spells it)."""

    lookup: bool = True
    store: bool = True
    max_age: int | None = None
    ttl: int | None = None

    @classmethod
    def parse(cls, header: str | None, ttl: int | None = None) -> CacheDirectives:
        lookup, store, max_age = True, True, None
        for part in filter(None, (p.strip().lower() for p in (header or "").split(","))):
            name, _, value = part.partition("=")
            if name == "no-cache":
                lookup = False
            elif name == "no-store":
                lookup = store = False
            elif name == "max-age":
                if not value.strip().isdigit():
                    raise APIError(400, f"Cache-Control max-age must be seconds, got {value!r}")
                max_age = int(value)
        return cls(lookup, store, max_age, ttl)


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


def _text(message: ChatMessage | TextMessage) -> str:
    """The message's text (only an assistant's may be null or no parts: ChatMessage)."""
    content = message.content
    if content is None or content == []:
        if message.role == "assistant":
            return ""
        raise APIError(
            400,
            f"a {message.role} message needs content: a string or at least one part",
            param="messages",
        )
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise APIError(
                400,
                f"only text content parts are supported, got {part.type!r}",
                param="messages",
            )
        texts.append(part.text)
    return "\n".join(texts)


def flatten_messages(messages: Sequence[ChatMessage | TextMessage]) -> list[dict[str, str]]:
    """OpenAI messages -> the engine's {"role", "content"} strings (developer -> system)."""
    if not messages:
        raise APIError(400, "messages must not be empty", param="messages")
    out = []
    for message in messages:
        if message.role in ("tool", "function"):
            raise APIError(400, f"{message.role} messages are not supported", param="messages")
        role = "system" if message.role == "developer" else message.role
        out.append({"role": role, "content": _text(message)})
    return out


def structure_size(messages: list[ChatMessage]) -> int:
    """What flattening and checking messages costs, by their number and their parts'
    (as off_loop.work_size counts a message: MESSAGE_CHARS)."""
    if len(messages) * MESSAGE_CHARS > INLINE_CHARS:  # big already: no need to walk it
        return len(messages) * MESSAGE_CHARS
    parts = sum(len(m.content) for m in messages if isinstance(m.content, list))
    return (len(messages) + parts) * MESSAGE_CHARS


def _refuse_unsupported(request: ChatCompletionRequest) -> None:
    """What the engine cannot honour gets a 400 naming the field, never silently ignored
    (with upstreams such requests were passed through before they got here)."""
    if (found := unkeyable(request)) is not None:
        raise APIError(
            400, f"{found.message} by the in-process engine", param=found.param, code=UNSUPPORTED
        )


def stop_list(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _servable(job: ChatJob, max_age: int | None, entry: CacheEntry) -> bool:
    """A cached answer must fit what this request allows: no older than its max-age,
    within its max_tokens and free of its stop sequences (otherwise another candidate,
    or the engine, answers)."""
    if max_age is not None and time.time() - entry.created > max_age:
        return False
    if job.max_tokens is not None:
        tokens = entry.metadata.get("completion_tokens")
        if not isinstance(tokens, int):
            # Unknown (seeded with no tokenizer at hand): a bound for byte-level BPE and
            # SentencePiece. No token is shorter than a byte; add a leading word marker
            # and the end-of-sequence token.
            tokens = len(entry.response.encode()) + 2
        if tokens > job.max_tokens:
            return False
    return not any(s in entry.response for s in job.stop)


def prefix_cache_salt(tenant: str, client_salt: str | None) -> str | None:
    """The engine's prefix-cache salt: tenants never share KV blocks (a prefix hit is
    fast, so shared blocks would let one tenant time another's prompts), and a client's
    own `cache_salt` narrows sharing within its tenant. Hashed: the tenant's name is not
    sent to remote engines. None (share freely) for the open single-user gateway."""
    if tenant == OPEN_TENANT and client_salt is None:
        return None
    key = json.dumps([tenant, client_salt])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def check_model(model: str, models: list[str]) -> None:
    """503 while no model is served yet; 404 for a model not served."""
    if not models:
        raise APIError(503, "no model is ready yet", "service_unavailable")
    if model not in models:
        raise APIError(
            404,
            f"The model {model!r} does not exist; available: {', '.join(models)}",
            param="model",
            code="model_not_found",
        )


def _forwarded(request: ChatCompletionRequest) -> dict[str, object]:
    """Fields the cache does not key on that only remote servers read: the end user's
    id, and vLLM's sampling fields at their neutral values (any other value bypasses)."""
    fields = {
        "user": request.user,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "repetition_penalty": request.repetition_penalty,
    }
    return {name: value for name, value in fields.items() if value is not None}


def to_job(
    request: ChatCompletionRequest,
    request_id: str,
    model: str,
    tenant: str,
    trace_id: str | None = None,
    session: str | None = None,
) -> ChatJob:
    """`request` as `model` runs it: the name it is served under (ModelRouter.route).
    `session` (the X-Session-Id header), else the end user's id, keeps the request on
    the remote server of its session's earlier ones."""
    _refuse_unsupported(request)
    # Ranges and lengths (temperature, top_p, max_tokens, stop, seed) were checked as the
    # body was decoded: they are constraints on ChatCompletionRequest's fields.
    return ForwardedJob(
        request_id=request_id,
        model=model,
        messages=flatten_messages(request.messages),
        max_tokens=request.max_completion_tokens or request.max_tokens,
        **sampling_given(request),
        stop=stop_list(request.stop),
        seed=request.seed,
        ignore_eos=request.ignore_eos,
        cache_salt=prefix_cache_salt(tenant, request.cache_salt),
        trace_id=trace_id,
        session=session or request.user,
        fields=_forwarded(request),
    )


class ChatService:
    def __init__(
        self,
        upstream: ModelRouter,
        cache: SemanticCache | None,
        metrics: GatewayMetrics,
        early_start: bool = True,
        share_flights: bool = False,
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
        self._stores: set[asyncio.Task[object]] = set()

    async def answer(
        self,
        request: ChatCompletionRequest,
        tenant: str,
        directives: CacheDirectives,
        trace_id: str | None = None,
        session: str | None = None,
    ) -> Answer:
        """`trace_id`: the request's X-Request-Id, which remote servers are sent;
        `session`: its X-Session-Id (gateway/upstream/routing.py)."""
        started = time.perf_counter()
        answer_id = f"chatcmpl-{uuid.uuid4().hex}"
        # The job, the cache's partition and the metrics name the served model (an
        # alias's target); the answer names the model the client asked for.
        model = self.upstream.route(request.model)

        def prepare(request: ChatCompletionRequest) -> ChatJob:
            job = to_job(request, answer_id, model, tenant, trace_id, session)
            self.upstream.refuse_oversized(job)
            return job

        # Off the event loop for many messages or parts (100,000 empty ones cost 50 ms).
        job = await run_sized(prepare, request, structure_size(request.messages))
        cache_request = CacheRequest(
            model=job.model,
            messages=job.messages,
            tenant=tenant,
            temperature=job.temperature,
        )
        lookup: LookupResult | None = None
        early: EarlyStart | None = None
        own: server_timing.Timings = {}  # the gateway's own timings: cache, embed
        if self.cache is not None and directives.lookup:
            if self.early_start and self.upstream.cheap_abort_of(job.model):
                early = EarlyStart(self.upstream.stream(job))
                # One turn of the loop: the early start reaches the engine before the
                # lookup's own work (hashing, the Redis round trips) runs.
                await asyncio.sleep(0)
            try:
                accept = partial(_servable, job, directives.max_age)
                asked = time.perf_counter()
                lookup = await self.cache.lookup(cache_request, accept=accept)
            except BaseException:
                await self._abort_early(early)
                raise
            if lookup.status != "bypass":  # a policy bypass never asked the cache
                own["cache"] = (time.perf_counter() - asked) * 1000
                if lookup.embed_seconds is not None:
                    own["embed"] = lookup.embed_seconds * 1000
            if lookup.hit is not None:
                await self._abort_early(early)
                return self._replay(answer_id, request.model, job, lookup.hit, started, own)
        # An answer cut at one of this request's stop sequences also ends with "stop",
        # but it is not the whole answer to the question: never store those.
        store = self.cache is not None and directives.store and not job.stop
        # "miss" means the cache was asked (a failed lookup is a miss: fail open).
        status = "miss" if lookup is not None and lookup.status != "bypass" else "bypass"
        headers = {}

        def produce() -> AsyncGenerator[Delta, None]:
            # The early start, unless it was given up for a flight that then got lost,
            # or turned away while other requests' early starts held the queue.
            if early is not None and not early.cancelled and not early.turned_away:
                self.metrics.early_starts.labels("used").inc()
                source, sent = early.deltas(), early.sent
            else:
                source, sent = self.upstream.stream(job), time.perf_counter()
            return self._produce(source, sent, cache_request, lookup, store, directives.ttl)

        if status == "miss" and self.cache is not None:
            variant = (job.max_tokens, tuple(job.stop), job.ignore_eos)
            leader, deltas = await self.cache.follow_or_lead(
                cache_request, lookup, produce, variant, self.codec
            )
            if not leader:
                headers["X-Cache-Coalesced"] = "true"
                deltas = _followed(deltas)
                await self._abort_early(early)  # the flight we follow does the work
        else:
            deltas = produce()
        first = await _first(deltas)  # raises the upstream's refusal as an APIError
        timed = self._timed(first, deltas, job.model, status, started, own)
        timings = server_timing.merge(own, first.timings)
        created = int(time.time())
        return Answer(
            answer_id, request.model, created, status, timed, headers, timings, first.upstream
        )

    async def uncached(self, job: ChatJob, reason: str) -> Answer:
        """`job` on the upstream, never looked up nor stored (text completions): counted
        as a bypass by `reason`, and observed for /metrics as any answer."""
        started = time.perf_counter()
        self.upstream.refuse_oversized(job)
        self.metrics.passed_through[reason] += 1
        deltas = self._counted(self.upstream.stream(job), job.model)
        first = await _first(deltas)  # raises the upstream's refusal as an APIError
        timed = self._timed(first, deltas, job.model, "bypass", started, {})
        timings = dict(first.timings or {})
        return Answer(job.request_id, job.model, int(time.time()), "bypass", timed, {}, timings)

    async def _counted(
        self, source: AsyncGenerator[Delta, None], model: str
    ) -> AsyncGenerator[Delta, None]:
        try:
            async for delta in source:
                if delta.finish_reason is not None:
                    self._count(delta, model)
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

    def _replay(
        self,
        answer_id: str,
        model: str,
        job: ChatJob,
        hit: Candidate,
        started: float,
        own: server_timing.Timings,
    ) -> Answer:
        entry = hit.entry
        headers = {
            "X-Cache-Similarity": f"{hit.similarity:.4f}",
            "X-Cache-Entry": entry.id,
            "Age": str(max(0, int(time.time() - entry.created))),
        }
        if (seconds := entry.generation_seconds) is not None:
            headers["X-Cache-Saved-Seconds"] = f"{seconds:.4f}"  # as stored: to 0.1 ms

        async def final() -> AsyncGenerator[Delta, None]:
            # Usage as the answer cost when it was generated (or counted when seeded): the
            # counts stored with the entry, its original prompt's. All of that prompt was
            # served from cache. A count the entry lacks (an upstream that sent no usage)
            # is counted here where this gateway has the model's tokenizer (the prompt:
            # this request's own).
            prompt = entry.metadata.get("prompt_tokens")
            completion = entry.metadata.get("completion_tokens")
            counter = None
            if not (isinstance(prompt, int) and isinstance(completion, int)):
                counter = token_counter(self.upstream, job.model)
            if counter is not None:
                if not isinstance(prompt, int):
                    with contextlib.suppress(ValueError):  # the chat template refused them
                        prompt = await counter.prompt(job.messages)
                if not isinstance(completion, int):
                    completion = await counter.completion(entry.response)
            known = isinstance(prompt, int)
            yield Delta(
                finish_reason="stop",
                prompt_tokens=prompt if known else 0,
                completion_tokens=completion if isinstance(completion, int) else 0,
                cached_tokens=prompt if known else None,
            )

        timed = self._timed(Delta(entry.response), final(), job.model, "hit", started, own)
        return Answer(answer_id, model, int(time.time()), "hit", timed, headers, own)

    async def _produce(
        self,
        source: AsyncGenerator[Delta, None],
        sent: float,
        cache_request: CacheRequest,
        lookup: LookupResult | None,
        store: bool,
        ttl: int | None,
    ) -> AsyncGenerator[Delta, None]:
        """The upstream's answer, teed into the cache. The store starts in the background
        as the final delta arrives, before it is handed on: the client's response ends
        without waiting for Redis, and a consumer that stops at the final delta cannot
        cancel the store. Inside a single-flight task the flight also waits for the
        store, so requests arriving after it hit the cache instead of starting again.
        `sent` is when the request went to the upstream (perf_counter): the answer is
        stored with the seconds from then to its final delta."""
        parts: list[str] = []
        stored: asyncio.Task[object] | None = None
        try:
            async for delta in source:
                parts.append(delta.text)
                if delta.finish_reason is not None:
                    seconds = time.perf_counter() - sent
                    text = "".join(parts)
                    stored = self._finish(delta, text, seconds, cache_request, lookup, store, ttl)
                yield delta
        finally:
            await source.aclose()  # leaving early aborts it
        if stored is not None:
            await asyncio.shield(stored)

    def _finish(
        self,
        final: Delta,
        text: str,
        seconds: float,
        cache_request: CacheRequest,
        lookup: LookupResult | None,
        store: bool,
        ttl: int | None,
    ) -> asyncio.Task[object] | None:
        """Counts the upstream's tokens and starts storing the answer (policy permitting),
        with its usage and `seconds`, how long the upstream took to produce it."""
        self._count(final, cache_request.model)
        if not store or self.cache is None:
            return None
        outcome = CompletionOutcome(text, final.finish_reason)
        counts = {
            "prompt_tokens": final.prompt_tokens,
            "completion_tokens": final.completion_tokens,
        }
        usage = {name: n for name, n in counts.items() if n is not None}
        # What a hit on it will save (CacheEntry.generation_seconds), to 0.1 ms.
        metadata = {**usage, "generation_seconds": round(seconds, 4)}
        task = asyncio.get_running_loop().create_task(
            self.cache.store_answer(cache_request, outcome, lookup, ttl, metadata)
        )
        # The loop holds tasks weakly: keep each store alive until it is done.
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)
        return task

    def _count(self, final: Delta, model: str) -> None:
        self.metrics.prompt_tokens.labels(model).inc(final.prompt_tokens or 0)
        self.metrics.generation_tokens.labels(model).inc(final.completion_tokens or 0)

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
    """A followed flight's answer, as its follower's. The upstream's timings are dropped:
    they are the leader's request's, which began before this one. A flight of another
    process reports its leader's failure as text only: the client gets it as an upstream
    error (502)."""
    try:
        async for delta in deltas:
            yield replace(delta, timings=None) if delta.timings is not None else delta
    except (FlightError, FlightLost) as exc:
        message = f"the answer this request followed failed: {exc}"
        raise APIError(502, message, "upstream_error") from exc
    finally:
        await deltas.aclose()


async def _first(deltas: AsyncGenerator[Delta, None]) -> Delta:
    try:
        return await anext(deltas)
    except StopAsyncIteration:
        raise APIError(502, "the upstream ended without an answer", "upstream_error") from None
    except BaseException:
        await deltas.aclose()
        raise

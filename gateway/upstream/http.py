"""Cache misses forwarded over HTTP to a pool of OpenAI-compatible servers (our own
`semgate serve --no-cache` engine servers, vLLM, ...), with health checks and retries;
which server answers is the balancer's choice (gateway/upstream/balancer.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import httpx

from engine.tokenizer import Tokenizer
from gateway.upstream.balancer import Backend, Balancer, BalancerConfig, BalancerKey, prompt_text
from gateway.upstream.base import (
    CompletionJob,
    Delta,
    EngineGauges,
    Unsupported,
    UpstreamError,
    UpstreamHealth,
)
from gateway.upstream.health_checks import RemoteServer
from gateway.upstream.openai_wire import http_error, parse_sse, request_body, upstream_failure
from gateway.upstream.remote_load import UNKNOWN_LOAD

logger = logging.getLogger(__name__)

# Failures where the request never produced an answer and the connection is gone: safe to
# run it again elsewhere as long as no delta has reached the caller.
_RETRYABLE = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)
# Of those, the ones after which the server may have begun on the request: it accepted
# the connection and the request, then dropped them. If no other server can answer, the
# client is told the upstream failed (502), not that none was there to ask (503).
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError)
# 5xx answers that say "this server cannot serve now" rather than "this request broke it".
_DOWN_STATUSES = (502, 503, 504)


def base_url(url: str) -> str:
    """A server's root however it was given: OpenAI clients and LiteLLM write an
    OpenAI-compatible server's URL with its /v1 (`http://host:8000/v1`), semgate without;
    the paths asked (/ready, /health, /v1/models, /v1/chat/completions) are the root's."""
    return url.rstrip("/").removesuffix("/v1")


class HttpUpstream:
    """A pool of remote OpenAI-compatible servers: a group serving `model` (each request
    goes to one of them, as `balancer` chooses), or, without one, servers whose models are
    discovered (each request goes to one of those that list its model). `weights`, one
    per URL, size each server's share (default: equal)."""

    cheap_abort = False  # each request aborted on a hit would cost a server a request
    forwards = True
    description = "the upstreams"
    awaited = "an upstream"  # any one healthy server will do

    def __init__(
        self,
        base_urls: list[str],
        timeout: float = 600.0,
        health_interval: float = 5.0,
        api_key: str | None = None,
        model: str | None = None,
        balancer: BalancerConfig | None = None,
        weights: list[float] | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("HttpUpstream needs at least one base URL")
        weights = weights or [1.0] * len(base_urls)
        if len(weights) != len(base_urls) or not all(w > 0 for w in weights):
            raise ValueError("HttpUpstream needs one positive weight per base URL")
        self.model = model
        self._servers = [
            RemoteServer(base_url(url), Backend(base_url(url), weight))
            for url, weight in zip(base_urls, weights, strict=True)
        ]
        self.balancer = Balancer(balancer or BalancerConfig())
        self._timeout = timeout
        self._health_interval = health_interval
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Probes every server once and starts the periodic health checks. Never fails
        on down servers: they are retried by the health loop."""
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout, connect=min(self._timeout, 10.0)),
            # Each streaming answer holds a connection for its whole generation.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
            headers=self._headers,
        )
        await self._probe_all()
        if not self.ready():
            logger.warning("no upstream is healthy yet: %s", self._describe())
        self._health_task = asyncio.create_task(self._health_loop(), name="upstream-health")

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def ready(self) -> bool:
        return any(s.healthy for s in self._servers)

    def models(self) -> list[str]:
        """A group's model, else the model ids any server has listed, first server's
        first. A model whose servers are all down stays listed: its requests get 503
        (retry later), not 404."""
        if self.model is not None:
            return [self.model]
        ids = (m for s in self._servers for m in s.models)
        return list(dict.fromkeys(ids))

    @property
    def unlisted(self) -> bool:
        """Whether a server whose models are discovered has not listed them yet (it has
        not answered since the start): any model may be its."""
        return self.model is None and any(not s.models for s in self._servers)

    def servers_of(self, model: str) -> list[str]:
        """The base URLs of the servers that serve `model`."""
        return [s.base for s in self._servers if self.model == model or model in s.models]

    @property
    def failure(self) -> str | None:
        return None  # servers down are probed again; health() says why each is down

    def tokenizer(self, model: str) -> Tokenizer | None:
        return None  # the servers' tokenizers are theirs

    def gauges(self) -> EngineGauges | None:
        return None  # remote engines report their own /metrics

    def health(self) -> list[UpstreamHealth]:
        policy = self.balancer.config.policy
        return [
            UpstreamHealth(
                s.base,
                s.healthy,
                s.load.running,
                s.load.waiting,
                None if s.healthy else s.error,
                in_flight=s.backend.in_flight,
                weight=s.backend.weight,
                requests=dict(s.backend.chosen),
                prefix_blocks=self.balancer.prefixes.size(s.base),
                models=(self.model,) if self.model is not None else tuple(s.models),
                policy=policy,
            )
            for s in self._servers
        ]

    def supports(self, job: CompletionJob) -> Unsupported | None:
        """Every job: what a job cannot carry never becomes one (the gateway passes such
        requests through as they came: gateway/passthrough.py)."""
        return None

    def refuse_oversized(self, job: CompletionJob) -> None:
        """Remote servers judge context length themselves."""

    async def stream(self, job: CompletionJob) -> AsyncGenerator[Delta, None]:
        """Runs `job` on a healthy server; before the first delta, a server that fails
        is marked down and the next one is tried (each at most once)."""
        body = request_body(job)
        key = self.balancer.key(job.model, prompt_text(job.messages), job.cache_salt, job.session)
        tried: set[str] = set()
        failures: list[str] = []
        request_id = job.trace_id or job.request_id
        while True:
            server, resp = await self._open(job.model, body, request_id, tried, failures, key)
            yielded = False
            try:
                if resp.status_code >= 500:  # this request broke it: not for the others
                    await resp.aread()
                    logger.warning("upstream %s: HTTP %d", server.base, resp.status_code)
                    raise UpstreamError(502, "the upstream failed", "upstream_error")
                if resp.status_code >= 400:
                    await resp.aread()
                    raise http_error(resp)
                async for delta in parse_sse(resp, job.max_tokens if job.default_cap else None):
                    yield delta if yielded else replace(delta, upstream=server.base)
                    yielded = True
                return
            except _RETRYABLE as exc:
                reason = f"{type(exc).__name__}: {exc}"
                self._mark_down(server, reason)
                if yielded:
                    raise _mid_answer() from exc
                failures.append(f"{server.base}: {reason}")
            except httpx.HTTPError as exc:
                raise upstream_failure(exc) from exc
            finally:
                server.backend.in_flight -= 1
                await resp.aclose()

    async def post(
        self,
        model: str,
        body: Mapping[str, Any],
        request_id: str,
        path: str = "/v1/chat/completions",
        session: str | None = None,
    ) -> tuple[str, httpx.Response]:
        """`body` as it is, POSTed to `path` on a healthy server that serves `model`, as stream()
        sends its jobs (servers that cannot be reached, or answer 502, 503 or 504, are
        marked down and the next is tried; routed by the body's prompt, its `user` or
        `session`), with `request_id` as its X-Request-Id. Returns the server's base URL
        and the response with its head read and its body not: the caller reads and closes
        it."""
        key = self.key_of(model, body, session)
        server, resp = await self._open(model, body, request_id, set(), [], key, path)
        resp.stream = _Released(resp.stream, server.backend)  # in flight until closed
        return server.base, resp

    async def _open(
        self,
        model: str,
        body: Mapping[str, Any],
        request_id: str,
        tried: set[str],
        failures: list[str],
        key: BalancerKey,
        path: str = "/v1/chat/completions",
    ) -> tuple[RemoteServer, httpx.Response]:
        """The first response (head only) from a healthy untried server that can serve
        now; when none is left, 502 if one dropped the request, else 503. The server
        returned counts the request in flight until the caller says it is done."""
        if self._client is None:
            raise RuntimeError("HttpUpstream used before start()")
        headers = {"X-Request-Id": request_id}  # the request's own, for the server's logs
        dropped = False
        while (server := self._pick(model, tried, key)) is not None:
            tried.add(server.base)
            request = self._client.build_request(
                "POST", server.base + path, json=body, headers=headers
            )
            # Counted from the choice on: the next request's choice sees it.
            server.backend.in_flight += 1
            try:
                resp = await self._client.send(request, stream=True)
            except _RETRYABLE as exc:
                server.backend.in_flight -= 1
                reason = f"{type(exc).__name__}: {exc}"
                self._mark_down(server, reason)
                failures.append(f"{server.base}: {reason}")
                dropped = dropped or isinstance(exc, _DROPPED)
                continue
            except BaseException as exc:  # a timeout, a failure not worth a retry, a cancel
                server.backend.in_flight -= 1
                if isinstance(exc, httpx.HTTPError):
                    raise upstream_failure(exc) from exc
                raise
            if resp.status_code in _DOWN_STATUSES:  # this server cannot serve now
                server.backend.in_flight -= 1
                await resp.aclose()
                failures.append(f"{server.base}: HTTP {resp.status_code}")
                self._mark_down(server, f"HTTP {resp.status_code}")
                continue
            return server, resp
        # Details (addresses, errors) go to the log, not to clients.
        logger.warning("no healthy upstream: %s", "; ".join(failures) or self._describe())
        if dropped:
            raise _mid_answer()
        raise UpstreamError(
            503,
            "no healthy upstream; retry shortly",
            type="service_unavailable",
            code="upstream_unavailable",
            retry_after=max(1, math.ceil(self._health_interval)),
        )

    def _pick(self, model: str, tried: set[str], key: BalancerKey) -> RemoteServer | None:
        """The balancer's choice among the healthy, untried servers that serve `model` (a
        model nobody serves was refused with a 404 before it got here: the model router's,
        gateway/upstream/model_router.py)."""
        candidates = {s.base: s for s in self._serving(model) if s.base not in tried}
        if not candidates:
            return None
        backends = [s.backend for s in candidates.values()]
        return candidates[self.balancer.choose(backends, key, retry=bool(tried)).name]

    def _serving(self, model: str) -> list[RemoteServer]:
        """The healthy servers that serve `model`."""
        return [
            s for s in self._servers if s.healthy and (self.model == model or model in s.models)
        ]

    def backends(self, model: str) -> list[Backend]:
        """The healthy servers that serve `model`, as the balancer sees them."""
        return [s.backend for s in self._serving(model)]

    def key_of(self, model: str, body: Mapping[str, Any], session: str | None) -> BalancerKey:
        """What a forwarded `body` is balanced by: its prompt, its prefix-cache salt, and
        `session`, else its `user`."""
        salt, user = _str_or_none(body.get("cache_salt")), _str_or_none(body.get("user"))
        return self.balancer.key(model, body_prompt(body), salt, session or user)

    def _mark_down(self, server: RemoteServer, reason: str) -> None:
        if server.healthy:
            logger.warning("upstream %s is down: %s", server.base, reason)
            self.balancer.forget(server.base)
        server.healthy, server.error = False, reason

    def _describe(self) -> str:
        return "; ".join(f"{s.base}: {s.error}" for s in self._servers if not s.healthy)

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(s) for s in self._servers))

    async def _probe(self, server: RemoteServer) -> None:
        """Healthy = ready and serving models (RemoteServer.probe_models). /health alone
        would not do: a loading semgate engine answers /health but is not ready."""
        assert self._client is not None
        probe_timeout = min(10.0, max(2.0, self._health_interval))
        try:
            models = await server.probe_models(self._client, probe_timeout)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._mark_down(server, f"health check failed: {type(exc).__name__}: {exc}")
            server.load = UNKNOWN_LOAD
            return
        if not server.healthy:
            logger.info("upstream %s is healthy, serving %s", server.base, ", ".join(models))
        server.healthy, server.models, server.error = True, models, ""
        server.load = await server.probe_load(self._client, probe_timeout)
        server.backend.observe(server.load.running, server.load.waiting)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval)
            try:
                await self._probe_all()
            except Exception:  # keep checking whatever one round hit
                logger.exception("upstream health check round failed")


def _mid_answer() -> UpstreamError:
    return UpstreamError(502, "the upstream failed mid-answer", "upstream_error")


class _Released(httpx.AsyncByteStream):
    """A pass-through's response body: its server counts it in flight until it closes."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, backend: Backend):
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream = stream
        self._backend: Backend | None = backend

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._backend is not None:  # closed at most once
                self._backend.in_flight -= 1
                self._backend = None


def body_prompt(body: Mapping[str, Any]) -> str | None:
    """What a forwarded body's prompt starts with: its chat messages, or its text
    completion's prompt (none for embeddings)."""
    if isinstance(messages := body.get("messages"), list):
        return prompt_text(m for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if prompt is None:
        return None
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None

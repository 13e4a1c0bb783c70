"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Literal

import msgspec
from litestar import Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import APIError
from gateway.openapi_docs import error_responses
from gateway.runtime import Runtime


@get(
    "/health",
    summary="200 while the process is up and can mend itself, else 503",
    description="Liveness: 503 only when a restart of the process is the way out (its "
    "engine core could not be restarted, again and again). A dead or hung engine core "
    "that is being restarted is /ready's business.",
    tags=["ops"],
    responses=error_responses(503),
)
async def health(runtime: Runtime) -> dict[str, str]:
    if (failure := runtime.alive_failure()) is not None:
        raise APIError(503, failure, "service_unavailable", "unhealthy")
    return {"status": "ok"}


class UpstreamView(msgspec.Struct, omit_defaults=True):
    name: str  # a remote server's base URL, or "in-process"
    up: bool
    detail: str | None = None  # why it is not used, while it is down
    # "prefill" or "decode" where a model's prompts are prefilled apart; absent ("both")
    # for servers that run whole requests.
    role: str = "both"


class ReadyView(msgspec.Struct, omit_defaults=True):
    status: Literal["ready"]
    models: list[str]
    cache: Literal["up", "down", "off"]
    cache_detail: str | None = None  # why the cache is down
    upstreams: list[UpstreamView] = msgspec.field(default_factory=list)


@get(
    "/ready",
    summary="200 while chat can be answered (the model or an upstream is up, and the "
    "server is not shutting down), else 503",
    description='The cache\'s state is in the body: "cache" is "up", "down" (starting, '
    "Redis down, or Redis hanging and skipped by the circuit breaker: chat is answered "
    'uncached; "cache_detail" says why) or "off". With upstreams, each one\'s state, '
    "why one that is down is not used (the 503 says it too), and its role where a model's "
    'prompts are prefilled apart: "prefill" or "decode".',
    tags=["ops"],
    responses=error_responses(503),
)
async def ready(runtime: Runtime) -> ReadyView:
    upstreams = [UpstreamView(h.name, h.up, h.detail, h.role) for h in runtime.upstream.health()]
    try:
        runtime.check_ready()
    except APIError as exc:  # and why each upstream is not used
        exc.message = "; ".join(
            [exc.message, *(f"{u.name}: {u.detail}" for u in upstreams if u.detail)]
        )
        raise
    models = runtime.upstream.models()
    return ReadyView("ready", models, runtime.cache_state, runtime.cache_down_reason(), upstreams)


# Litestar adds the charset to a text/* media type itself: given prometheus_client's
# full content type, the header carried it twice.
METRICS_MEDIA_TYPE = CONTENT_TYPE_LATEST.removesuffix("; charset=utf-8")


@get("/metrics", summary="Prometheus metrics", tags=["ops"], media_type=METRICS_MEDIA_TYPE)
async def metrics(runtime: Runtime) -> Response[bytes]:
    body = generate_latest(runtime.metrics.registry)
    return Response(body, media_type=METRICS_MEDIA_TYPE)

"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from litestar import Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.runtime import Runtime


@get("/health", summary="The process is up", tags=["ops"])
async def health() -> dict[str, str]:
    return {"status": "ok"}


@get(
    "/ready",
    summary="200 while chat can be answered (the model or an upstream is up), else 503",
    description='The cache\'s state is in the body: "cache" is "up", "down" (starting, or '
    'Redis down: chat is answered uncached; "cache_detail" says why) or "off".',
    tags=["ops"],
)
async def ready(runtime: Runtime) -> dict[str, object]:
    runtime.check_ready()
    body: dict[str, object] = {
        "status": "ready",
        "models": runtime.upstream.models(),
        "cache": runtime.cache_state,
    }
    if (reason := runtime.cache_down_reason()) is not None:
        body["cache_detail"] = reason
    return body


# Litestar adds the charset to a text/* media type itself: given prometheus_client's
# full content type, the header carried it twice.
METRICS_MEDIA_TYPE = CONTENT_TYPE_LATEST.removesuffix("; charset=utf-8")


@get("/metrics", summary="Prometheus metrics", tags=["ops"], media_type=METRICS_MEDIA_TYPE)
async def metrics(runtime: Runtime) -> Response[bytes]:
    body = generate_latest(runtime.metrics.registry)
    return Response(body, media_type=METRICS_MEDIA_TYPE)

"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from litestar import Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.runtime import Runtime


@get("/health", summary="The process is up", tags=["ops"])
async def health() -> dict[str, str]:
    return {"status": "ok"}


@get("/ready", summary="503 until the model (and Redis, with the cache on) are up", tags=["ops"])
async def ready(runtime: Runtime) -> dict[str, object]:
    runtime.check_ready(need_cache=True)
    return {"status": "ready", "models": runtime.upstream.models(), "cache": runtime.cache_on}


@get("/metrics", summary="Prometheus metrics", tags=["ops"], media_type=CONTENT_TYPE_LATEST)
async def metrics(runtime: Runtime) -> Response[bytes]:
    body = generate_latest(runtime.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

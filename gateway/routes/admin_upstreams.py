"""GET /admin/upstreams: each server that answers misses, as routing sees it now."""

from __future__ import annotations

import msgspec
from litestar import get

from gateway.openapi_docs import error_responses
from gateway.runtime import Runtime


class UpstreamView(msgspec.Struct):
    upstream: str  # a remote server's base URL, or "in-process"
    models: list[str]
    up: bool
    policy: str | None  # its group's routing policy (gateway/upstream/balancer.py)
    weight: float
    in_flight: int  # this gateway's requests on it now
    running: int | None  # its engine's own counts at the last health check (None: unknown)
    waiting: int | None
    requests: dict[str, int]  # sent to it since the start, by why routing chose it
    prefix_blocks: int  # prompt-start blocks routing remembers it was sent


@get(
    "/upstreams",
    summary="Each upstream server: health, load, and the requests routing sent it",
    responses=error_responses(401, 403, 429),
)
async def upstreams(runtime: Runtime) -> list[UpstreamView]:
    return [
        UpstreamView(
            upstream=h.name,
            models=list(h.models),
            up=h.up,
            policy=h.policy,
            weight=h.weight,
            in_flight=h.in_flight,
            running=h.running,
            waiting=h.waiting,
            requests=dict(h.requests),
            prefix_blocks=h.prefix_blocks,
        )
        for h in runtime.upstream.health()
    ]

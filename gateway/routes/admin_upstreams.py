"""GET /admin/upstreams: each server that answers misses, as the balancer sees it now."""

from __future__ import annotations

import msgspec
from litestar import get

from gateway.openapi_docs import error_responses
from gateway.runtime import Runtime


class UpstreamView(msgspec.Struct):
    """An `UpstreamHealth` (gateway/upstream/base.py) as shown: its fields of these names."""

    name: str = msgspec.field(name="upstream")  # a remote server's base URL, or "in-process"
    models: list[str]
    up: bool
    policy: str | None  # its group's balancer policy (gateway/upstream/balancer.py)
    weight: float
    in_flight: int  # this gateway's requests on it now
    running: int | None  # its engine's own counts at the last health check (None: unknown)
    waiting: int | None
    requests: dict[str, int]  # sent to it since the start, by why the balancer chose it
    prefix_blocks: int  # prompt-start blocks the balancer remembers it was sent
    role: str  # prefill, decode (its model's prompts are prefilled apart), or both


@get(
    "/upstreams",
    summary="Each upstream server: health, load, and the requests the balancer sent it",
    responses=error_responses(401, 403, 429),
)
async def upstreams(runtime: Runtime) -> list[UpstreamView]:
    health = runtime.upstream.health()
    return msgspec.convert(health, list[UpstreamView], from_attributes=True)

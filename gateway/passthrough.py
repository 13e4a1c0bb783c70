"""Pass-through: with upstreams, a request the cache cannot key (gateway/bypass.py) is
sent to them as it came, and its client gets the upstream's own response, JSON or SSE,
answer or error, byte for byte: tool-call deltas, logprobs and every choice reach it.
It is never looked up nor stored; it leaves with `X-Cache-Status: Bypass` and
`X-Cache-Bypass-Reason`, and is counted by reason. A cache in front must never be why a
feature stops working."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
from litestar import Response
from litestar.response import Stream

from gateway import server_timing
from gateway.completions import check_model, prefix_cache_salt
from gateway.metrics import GatewayMetrics
from gateway.schemas import ChatCompletionRequest
from gateway.upstream import HttpUpstream, UpstreamError
from gateway.upstream.http import http_error, upstream_failure

# The gateway's own fields, never sent on: the answer's cache TTL, and the client's
# prefix-cache salt (replaced by the tenant's, as on the cached path).
_GATEWAY_FIELDS = ("cache", "cache_salt")


def _forwarded(
    body: Mapping[str, Any], request: ChatCompletionRequest, tenant: str
) -> dict[str, Any]:
    forwarded = {name: value for name, value in body.items() if name not in _GATEWAY_FIELDS}
    salt = prefix_cache_salt(tenant, request.cache_salt)
    if salt is not None:
        forwarded["cache_salt"] = salt
    return forwarded


def _openai_error(content: bytes) -> bool:
    try:
        parsed = json.loads(content)
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)


class PassThrough:
    """Answers pass-throughs from the upstreams' servers (those HttpUpstream picks)."""

    def __init__(self, upstream: HttpUpstream, metrics: GatewayMetrics) -> None:
        self.upstream = upstream
        self.metrics = metrics

    async def answer(
        self,
        request: ChatCompletionRequest,
        body: Mapping[str, Any],
        reason: str,
        tenant: str,
    ) -> Response[bytes] | Stream:
        """The upstream's response to `body` (the request as received)."""
        started = time.perf_counter()
        check_model(request.model, self.upstream.models())
        self.metrics.passed_through[reason] += 1
        forwarded = _forwarded(body, request, tenant)
        resp = await self.upstream.post(request.model, forwarded, f"chatcmpl-{uuid.uuid4().hex}")
        headers = {"X-Cache-Status": "Bypass", "X-Cache-Bypass-Reason": reason}
        # Durations only, as on the cached path (the gateway adds none: nothing was asked).
        if timings := server_timing.parse(resp.headers.get("server-timing", "")):
            headers["Server-Timing"] = server_timing.header(timings)
        media = resp.headers.get("content-type", "application/json")
        streamed = False
        try:
            if resp.status_code >= 400:
                return await _error(resp, headers)
            if media.startswith("text/event-stream"):
                streamed = True  # the relay closes it
                return Stream(
                    self._relay(resp, request.model, started), media_type=media, headers=headers
                )
            content = await resp.aread()
        except httpx.HTTPError as exc:
            raise upstream_failure(exc) from exc
        finally:
            if not streamed:
                await resp.aclose()
        self.metrics.e2e.labels(request.model, "bypass").observe(time.perf_counter() - started)
        return Response(content, media_type=media, headers=headers)

    async def _relay(
        self, resp: httpx.Response, model: str, started: float
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in resp.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            # Mid-stream: the status is sent; an error event ends it, as on the cached path.
            yield b"data: " + upstream_failure(exc).event() + b"\n\ndata: [DONE]\n\n"
        else:
            self.metrics.e2e.labels(model, "bypass").observe(time.perf_counter() - started)
        finally:
            await resp.aclose()


async def _error(resp: httpx.Response, headers: dict[str, str]) -> Response[bytes]:
    """An upstream error in OpenAI's shape is passed on as it is, status and all; any
    other is made one. 401 and 403 concern the gateway's key, not the client's."""
    content = await resp.aread()
    if resp.status_code in (401, 403) or not _openai_error(content):
        if resp.status_code >= 500:
            raise UpstreamError(502, "the upstream failed", "upstream_error")
        raise http_error(resp)
    if (retry_after := resp.headers.get("retry-after")) is not None:
        headers["Retry-After"] = retry_after
    return Response(
        content, status_code=resp.status_code, media_type="application/json", headers=headers
    )

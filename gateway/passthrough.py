"""Pass-through: with upstreams, a request the cache cannot key (cache/policy.py) is
sent to them as it came, and its client gets the upstream's own response, JSON or SSE,
answer or error, byte for byte: tool-call deltas, logprobs and every choice reach it.
It is never looked up nor stored; it leaves with `X-Cache-Status: Bypass` and
`X-Cache-Bypass-Reason`, and is counted by reason. A cache in front must never be why a
feature stops working. Text completions go the same way, to the upstreams'
/v1/completions (gateway/routes/text_completions.py), and embeddings of models the bundled
embedder is not, to their /v1/embeddings (gateway/embeddings.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
from litestar import Response
from litestar.response import Stream

from gateway import server_timing
from gateway.embeddings import EmbeddingRequest
from gateway.job_translation import prefix_cache_salt
from gateway.metrics import GatewayMetrics
from gateway.model_rename import renamed, renamed_lines
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.upstream import ModelRouter, UpstreamError
from gateway.upstream.openai_wire import context_length_error, http_error, upstream_failure

# The gateway's own fields, never sent on: the answer's cache TTL, and the client's
# prefix-cache salt (replaced by the tenant's, as on the cached path).
_GATEWAY_FIELDS = ("cache", "cache_salt")
CHAT_PATH = "/v1/chat/completions"
# Each path's field that a prompt over the context is too long in.
_PROMPT_FIELDS = {CHAT_PATH: "messages", "/v1/completions": "prompt", "/v1/embeddings": "input"}
Forwardable = ChatCompletionRequest | CompletionRequest | EmbeddingRequest


def _forwarded(body: Mapping[str, Any], request: Forwardable, tenant: str) -> dict[str, Any]:
    forwarded = {name: value for name, value in body.items() if name not in _GATEWAY_FIELDS}
    if isinstance(request, EmbeddingRequest):  # no prompt cache to salt
        return forwarded
    salt = prefix_cache_salt(tenant, request.cache_salt)
    if salt is not None:
        forwarded["cache_salt"] = salt
    return forwarded


def _openai_error(content: bytes) -> dict[str, Any] | None:
    """The `error` object of a body in OpenAI's error shape, else None."""
    try:
        parsed = json.loads(content)
    except ValueError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return error if isinstance(error, dict) else None


class PassThrough:
    """Answers pass-throughs from the servers of the request's model (those HttpUpstream
    picks), under the name they serve it by; the response names the model as asked (not
    an alias's target, nor whatever the server calls it: llama-server names its file)."""

    def __init__(
        self, upstream: ModelRouter, metrics: GatewayMetrics, name_upstream: bool = False
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.name_upstream = name_upstream  # X-Upstream: the server that answered

    def serves(self, model: str) -> bool:
        """Whether remote servers serve `model` (404 or 503 for a model nobody serves,
        ModelRouter.target); the in-process engine's model is not passed through."""
        return self.upstream.remote(model) is not None

    async def answer(
        self,
        request: Forwardable,
        body: Mapping[str, Any],
        reason: str,
        tenant: str,
        request_id: str,
        path: str = CHAT_PATH,
        session: str | None = None,
    ) -> Response[bytes] | Stream:
        """The upstream's response to `body` (the request as received), POSTed to `path`
        (chat, text completions or embeddings) with the request's id; `session` keeps it
        on its session's server."""
        started = time.perf_counter()
        remote = self.upstream.remote(request.model)
        assert remote is not None, "asked only for models that serves() passes through"
        servers, served = remote
        self.metrics.passed_through[reason] += 1
        forwarded = {**_forwarded(body, request, tenant), "model": served}
        server, resp = await servers.post(served, forwarded, request_id, path, session)
        headers = {"X-Cache-Status": "Bypass", "X-Cache-Bypass-Reason": reason}
        if self.name_upstream:
            headers["X-Upstream"] = server
        # Durations only, as on the cached path (the gateway adds none: nothing was asked).
        if timings := server_timing.parse(resp.headers.get("server-timing", "")):
            headers["Server-Timing"] = server_timing.header(timings)
        media = resp.headers.get("content-type", "application/json")
        streamed = False
        try:
            if resp.status_code >= 400:
                return await _error(resp, headers, _PROMPT_FIELDS.get(path, "messages"))
            if media.startswith("text/event-stream"):
                streamed = True  # the relay closes it
                return Stream(
                    self._relay(resp, served, started, request.model),
                    media_type=media,
                    headers=headers,
                )
            content = renamed(await resp.aread(), request.model)
        except httpx.HTTPError as exc:
            raise upstream_failure(exc) from exc
        finally:
            if not streamed:
                await resp.aclose()
        self.metrics.e2e.labels(served, "bypass").observe(time.perf_counter() - started)
        return Response(content, media_type=media, headers=headers)

    async def _relay(
        self, resp: httpx.Response, model: str, started: float, rename: str
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in renamed_lines(resp.aiter_bytes(), rename):
                yield chunk
        except httpx.HTTPError as exc:
            # Mid-stream: the status is sent; an error event ends it, as on the cached path.
            yield b"data: " + upstream_failure(exc).event() + b"\n\ndata: [DONE]\n\n"
        else:
            self.metrics.e2e.labels(model, "bypass").observe(time.perf_counter() - started)
        finally:
            await resp.aclose()


async def _error(resp: httpx.Response, headers: dict[str, str], prompt: str) -> Response[bytes]:
    """An upstream error in OpenAI's shape is passed on as it is, status and all; any
    other is made one, and so is a refusal of a prompt over the context (llama-server's
    type is not OpenAI's code; `prompt` names the field). 401 and 403 concern the
    gateway's key, not the client's."""
    content = await resp.aread()
    error = _openai_error(content)
    if (
        resp.status_code in (401, 403)
        or error is None
        or context_length_error(resp.status_code, error)
    ):
        if resp.status_code >= 500:
            raise UpstreamError(502, "the upstream failed", "upstream_error")
        raise http_error(resp, prompt)
    if (retry_after := resp.headers.get("retry-after")) is not None:
        headers["Retry-After"] = retry_after
    return Response(
        content, status_code=resp.status_code, media_type="application/json", headers=headers
    )

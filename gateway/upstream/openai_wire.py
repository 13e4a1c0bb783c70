"""What goes over the wire to an OpenAI-compatible server and comes back: a job as a
streaming chat request's body, the SSE answer as `Delta`s, and the server's refusals and
failures as the `UpstreamError`s its client is told."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from gateway import server_timing
from gateway.errors import CONTEXT_LENGTH_EXCEEDED
from gateway.upstream.base import CompletionJob, Delta, UpstreamError

logger = logging.getLogger(__name__)


def upstream_failure(exc: httpx.HTTPError) -> UpstreamError:
    """A failure not worth another server's time, as its client is told."""
    if isinstance(exc, httpx.TimeoutException):
        logger.warning("upstream timed out: %r", exc)
        return UpstreamError(504, "the upstream timed out", "upstream_error")
    logger.warning("upstream failed: %r", exc)
    return UpstreamError(502, "the upstream failed", "upstream_error")


# The request's fields that only remote servers read, sent as they came: the end user's
# id, and vLLM's sampling fields (at their neutral values: any other passes through).
FORWARDED_FIELDS = ("user", "top_k", "min_p", "repetition_penalty")


def request_body(job: CompletionJob) -> dict[str, Any]:
    """`job` as a streaming chat request that asks for the usage on its last chunk."""
    body: dict[str, Any] = {
        **{name: job.fields[name] for name in FORWARDED_FIELDS if name in job.fields},
        "model": job.model,
        "messages": job.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": job.temperature,
        "top_p": job.top_p,
    }
    if job.client_max_tokens is not None:
        body["max_tokens"] = job.client_max_tokens
    if job.stop:
        body["stop"] = job.stop
    if job.seed is not None:
        body["seed"] = job.seed
    if job.ignore_eos:
        body["ignore_eos"] = True
    if job.cache_salt is not None:
        body["cache_salt"] = job.cache_salt
    if job.kv_transfer_params is not None:
        body["kv_transfer_params"] = job.kv_transfer_params
    return body


async def parse_sse(resp: httpx.Response, cut_at: int | None = None) -> AsyncGenerator[Delta, None]:
    """Text deltas as they arrive, then exactly one final delta with finish_reason and
    usage, yielded at [DONE] (or at the end of the body once a finish_reason was seen).
    `cut_at`: a default cap the server was not sent; after that many text deltas (each
    at least one token) the answer ends with finish_reason "length", usage unknown, and
    closing the response stops the server's generation.
    The server's timings pass through: its response's Server-Timing (every line of it, as
    httpx joins them) on the first delta, and with its final chunk's `timings` (later
    values win) on the last."""
    head = server_timing.parse(resp.headers.get("server-timing", ""))
    finish: str | None = None
    usage: dict[str, Any] = {}
    timings = dict(head)
    told = False
    deltas = 0
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments, event names
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise UpstreamError(
                502, f"malformed event from upstream: {data[:200]!r}", "upstream_error"
            ) from None
        if chunk.get("error"):
            raise _event_error(chunk["error"])
        usage = chunk.get("usage") or usage
        timings.update(server_timing.of_chunk(chunk))
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            text = (choice.get("delta") or {}).get("content")
            if text:
                yield Delta(text=text, timings=None if told else head or None)
                told = True
                deltas += 1
            finish = choice.get("finish_reason") or finish
        if finish is None and cut_at is not None and deltas >= cut_at:
            finish = "length"
            break
    else:
        if finish is None:
            raise UpstreamError(502, "upstream ended the stream mid-answer", "upstream_error")
    yield Delta(
        finish_reason=finish or "stop",
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_tokens=_cached_tokens(usage),
        timings=timings or None,
    )


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    """The prompt tokens the server's prefix cache served, where it says (vLLM with
    --enable-prompt-tokens-details, semgate; vLLM may send null)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


# OpenAI error types -> the HTTP status they imply (an SSE error event carries no status).
_TYPE_STATUS = {"invalid_request_error": 400, "rate_limit_error": 429, "service_unavailable": 503}


def _event_error(err: Any) -> UpstreamError:
    """An error event in the stream: vLLM puts the status in `code`, we in `type`."""
    err = err if isinstance(err, dict) else {"message": str(err)}
    code = err.get("code")
    if isinstance(code, int) and 400 <= code < 600:
        status, code = code, None
    else:
        status = _TYPE_STATUS.get(str(err.get("type")), 502)
    message = str(err.get("message") or "upstream error")
    return UpstreamError(status, message, "upstream_error", code if isinstance(code, str) else None)


def context_length_error(status: int, err: Any) -> bool:
    """Whether a server's error refuses a prompt over its context: llama-server says so by
    its own type, vLLM by OpenAI's words (with an HTTP status in `code`)."""
    if status != 400 or not isinstance(err, dict):
        return False
    message = str(err.get("message") or "")
    return err.get("type") == "exceed_context_size_error" or "maximum context length" in message


def http_error(resp: httpx.Response, prompt: str = "messages") -> UpstreamError:
    """A 4xx from the server, passed through with its OpenAI error fields; except 401 and
    403, which concern the gateway's own key to the upstream, not the client's, and a
    prompt over the context, which is OpenAI's `context_length_exceeded` naming `prompt`
    (the in-process engine's too) whatever the server calls it."""
    if resp.status_code in (401, 403):
        logger.error("the upstream refused the gateway's key (HTTP %d)", resp.status_code)
        return UpstreamError(502, "the upstream refused the gateway", "upstream_error")
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        err = None
    if not isinstance(err, dict):
        err = {"message": resp.text[:500] or f"HTTP {resp.status_code}"}
    if context_length_error(resp.status_code, err):
        message = str(err.get("message"))
        return UpstreamError(400, message, code=CONTEXT_LENGTH_EXCEEDED, param=prompt)
    code = err.get("code")
    retry_after = None
    if resp.status_code == 429:
        with contextlib.suppress(ValueError):
            retry_after = max(1, math.ceil(float(resp.headers.get("retry-after", ""))))
    return UpstreamError(
        resp.status_code,
        str(err.get("message") or f"HTTP {resp.status_code}"),
        type=str(err.get("type") or "invalid_request_error"),
        code=code if isinstance(code, str) else None,
        param=err.get("param") if isinstance(err.get("param"), str) else None,
        retry_after=retry_after,
    )

"""One streaming chat completion over HTTP, timed chunk by chunk into a RequestRecord."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx

from gateway import server_timing
from loadtest.record import RequestRecord
from loadtest.work_item import WorkItem


@dataclass(frozen=True)
class Endpoint:
    url: str  # the chat completions URL
    model: str
    api_key: str | None = None
    ignore_eos: bool = True  # send vLLM's ignore_eos for items whose length the workload sets
    temperature: float = 0.0
    timeout: float = 300.0  # seconds a request may take in all
    cache_store: bool = True  # False: Cache-Control no-store, a semgate gateway skips its cache

    @staticmethod
    def chat_url(base: str) -> str:
        """Accepts the server root, its /v1, or the full chat completions URL."""
        base = base.rstrip("/")
        if base.endswith("/chat/completions"):
            return base
        return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")

    def headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if not self.cache_store:
            headers["Cache-Control"] = "no-store"
        return headers

    def sends_ignore_eos(self, item: WorkItem) -> bool:
        return self.ignore_eos and item.exact_length

    def body(self, item: WorkItem) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": item.messages,
            "max_tokens": item.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.sends_ignore_eos(item):
            body["ignore_eos"] = True
        return body


def _error_fields(payload: Any) -> tuple[str | None, str | None]:
    """(code, message) of an OpenAI error body, as far as it has them."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return None, str(payload)[:200] if payload else None
    code = error.get("code") or error.get("type")
    return (str(code) if code else None), str(error.get("message", ""))[:200]


def _seconds(value: str | None) -> float | None:
    """A header's seconds, if it holds a finite, non-negative number."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


async def _read_stream(response: httpx.Response, record: RequestRecord, sent: float) -> None:
    last_chunk: float | None = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, `event:` lines
        data = line[5:].strip()
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if "error" in payload:
            record.error = "stream_error"
            record.error_code, record.error_message = _error_fields(payload)
            return
        for choice in payload.get("choices") or []:
            if choice.get("delta", {}).get("content"):
                now = time.perf_counter()
                if last_chunk is None:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last_chunk)
                last_chunk = now
            record.finish_reason = choice.get("finish_reason") or record.finish_reason
        usage = payload.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        if final := server_timing.of_chunk(payload):
            # The headers had the phases known at the stream's start; its end has them all.
            record.timings = {**(record.timings or {}), **final}
    record.error = "protocol"
    record.error_message = "the stream ended without [DONE]"


async def send(
    client: httpx.AsyncClient, endpoint: Endpoint, item: WorkItem, record: RequestRecord
) -> None:
    """Sends `item` and fills `record` in; never raises for what the server or the network
    does (that becomes record.error), only for cancellation."""
    sent = time.perf_counter()
    try:
        async with (
            asyncio.timeout(endpoint.timeout),
            client.stream(
                "POST", endpoint.url, json=endpoint.body(item), headers=endpoint.headers()
            ) as response,
        ):
            record.status_code = response.status_code
            record.cache_status = response.headers.get("x-cache-status")
            record.timings = server_timing.parse(response.headers.get("server-timing", "")) or None
            record.saved_seconds = _seconds(response.headers.get("x-cache-saved-seconds"))
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"http_{response.status_code}"
                try:
                    record.error_code, record.error_message = _error_fields(json.loads(body))
                except ValueError:
                    record.error_message = body[:200]
                return
            await _read_stream(response, record, sent)
    except asyncio.CancelledError:
        record.error = "cancelled"
        raise
    except (TimeoutError, httpx.TimeoutException):
        record.error = "timeout"
    except httpx.ConnectError as exc:
        record.error, record.error_message = "connect", str(exc)[:200]
    except httpx.TransportError as exc:  # the connection broke mid-request
        record.error, record.error_message = "transport", f"{type(exc).__name__}: {exc}"[:200]
    except ValueError as exc:  # a data line that is not JSON
        record.error, record.error_message = "protocol", str(exc)[:200]
    finally:
        record.e2e = time.perf_counter() - sent

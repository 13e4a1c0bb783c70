"""Prefill and decode apart, in vLLM's P/D protocol as its own proxy speaks it: a model's
decode servers (an `HttpUpstream`) beside its prefill servers (another, with a balancer of
its own: prefix routing applies within each pool).

Each request is decided once (`Disaggregated.decide`: Dynamo's conditional
disaggregation). A prompt whose tokens not already cached on the decode servers exceed
`min_prompt_tokens`, while the prefill servers' queue is short, first goes to a prefill
server as vLLM's proxy sends it (`max_tokens: 1`, not streamed, `kv_transfer_params:
{"do_remote_decode": true, ...}`); the request then goes to the decode servers carrying
the `kv_transfer_params` of that answer, and the decode server loads the prompt's KV
instead of computing it. Anything else (a short prompt, a prefill pool busy or down, a
prefill that fails or answers without the params, and any request for failure_backoff
seconds after such a prefill) sends the request unchanged: its decode server prefills it
itself. A prefill never fails a request: it is logged and counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from gateway import server_timing
from gateway.upstream.balancer import Backend
from gateway.upstream.base import (
    CompletionJob,
    Delta,
    UpstreamError,
    UpstreamHealth,
)
from gateway.upstream.http import HttpUpstream, body_prompt
from gateway.upstream.openai_wire import request_body
from gateway.upstream.prefix_table import BLOCK_BYTES, BYTES_PER_TOKEN

logger = logging.getLogger(__name__)

PHASE = "pd-prefill"  # the remote prefill's Server-Timing name (gateway/server_timing.py)
CHAT_PATH = "/v1/chat/completions"
# The endpoints whose requests a prefill server can prefill (each hop asks the same one).
PREFILLED_PATHS = (CHAT_PATH, "/v1/completions")
# What vLLM's P/D proxy asks of a prefill server: keep the KV for a decode server.
REMOTE_DECODE: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Fields vLLM's proxy does not send a prefill server (they would hold its one token back).
_DECODE_ONLY = ("stream_options", "min_tokens", "min_completion_tokens")
REMOTE = "long_prompt"  # the one reason to prefill remotely; every other is local
# Why a request was prefilled where it was: `semgate_pd_requests_total{route, reason}`.
REASONS = {
    REMOTE: "remote",
    "short_prompt": "local",  # its uncached tokens are pd_min_prompt_tokens or fewer
    "prefill_busy": "local",  # the prefill servers' queue is pd_max_prefill_queue or more
    "prefill_down": "local",  # no healthy prefill server serves its model
    "prefill_failed": "local",  # the prefill server failed, timed out or refused it
    "no_params": "local",  # the prefill server answered without kv_transfer_params
    "prefill_backoff": "local",  # a remote prefill failed within pd_failure_backoff
    "client_params": "local",  # the client sent kv_transfer_params of its own
}

# Counts one request's route: model, route ("remote" | "local"), reason.
CountDecision = Callable[[str, str, str], None]


@dataclass(frozen=True)
class PdRule:
    """gateway/settings.py's pd_* settings, which say why their defaults."""

    min_prompt_tokens: int
    max_prefill_queue: int  # per healthy prefill server
    failure_backoff: float  # seconds of local prefills after a failed remote one


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` as vLLM's proxy sends it to a prefill server: one token, not streamed."""
    sent = {name: value for name, value in body.items() if name not in _DECODE_ONLY}
    sent.update(kv_transfer_params=dict(REMOTE_DECODE), stream=False, max_tokens=1)
    if "max_completion_tokens" in body:
        sent["max_completion_tokens"] = 1
    return sent


def uncached_tokens(body: Mapping[str, Any], cached_blocks: int) -> int:
    """About how many of the prompt's tokens a decode server holding `cached_blocks` of its
    start (gateway/upstream/prefix_table.py's blocks) would compute: its token ids' count,
    or its text's size in tokens, less the share those blocks cover."""
    size = len((body_prompt(body) or "").encode())
    if not size:
        return 0
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        tokens: float = len(prompt)  # token ids
    else:
        tokens = size / BYTES_PER_TOKEN
    cached = min(cached_blocks * BLOCK_BYTES, size)
    return round(tokens * (size - cached) / size)


def queue_of(prefill: list[Backend]) -> int:
    """The prefill servers' queue: this gateway's requests in flight on them, and the
    others' running and waiting requests their /metrics showed at the last health check."""
    return sum(b.in_flight + b.others for b in prefill)


class Disaggregated(HttpUpstream):
    """One model's (or the discovered models') decode servers, which prefill servers of
    their own (`prefill`, a pool with its own balancer) prefill for: everything but the
    prefill is the decode pool's, as HttpUpstream does it."""

    def __init__(
        self,
        base_urls: list[str],
        prefill: HttpUpstream,
        rule: PdRule,
        count: CountDecision,
        **pool: Any,
    ) -> None:
        """`pool`: HttpUpstream's settings of the decode servers."""
        super().__init__(base_urls, **pool)
        self.prefill = prefill
        self.rule = rule
        self._count = count
        # Per model, time.monotonic(): no remote prefill before it (a pool of discovered
        # models serves several: one model's failed prefill says nothing of another's).
        self._backoff_until: dict[str, float] = {}

    async def start(self) -> None:
        await asyncio.gather(super().start(), self.prefill.start())

    async def close(self) -> None:
        await self.prefill.close()
        await super().close()

    def health(self) -> list[UpstreamHealth]:
        """Both pools: the decode servers, then the prefill servers, each with its role."""
        decode = [replace(h, role="decode") for h in super().health()]
        return decode + [replace(h, role="prefill") for h in self.prefill.health()]

    def decide(self, model: str, body: Mapping[str, Any], session: str | None) -> str:
        """Why `body` is prefilled where it is (a key of REASONS): remotely only when its
        tokens not cached on the decode servers (the longest start of it the decode pool's
        prefix table holds for any of its healthy servers: where prefix routing sends it)
        exceed min_prompt_tokens, the prefill servers' queue is under max_prefill_queue
        per healthy server, and no remote prefill failed in the last failure_backoff s."""
        if body.get("kv_transfer_params") is not None:
            return "client_params"  # the client runs the protocol itself
        key = self.key_of(model, body, session)
        names = {b.name for b in self.backends(model)}
        cached = max(self.balancer.prefixes.matches(key.blocks, names).values(), default=0)
        if uncached_tokens(body, cached) <= self.rule.min_prompt_tokens:
            return "short_prompt"
        prefill = self.prefill.backends(model)
        if not prefill:
            return "prefill_down"
        if time.monotonic() < self._backoff_until.get(model, 0.0):
            return "prefill_backoff"
        if queue_of(prefill) >= self.rule.max_prefill_queue * len(prefill):
            return "prefill_busy"
        return REMOTE

    async def _prefilled(
        self, model: str, body: Mapping[str, Any], request_id: str, path: str, session: str | None
    ) -> tuple[dict[str, Any] | None, float | None]:
        """The decided route for `body`, counted: the kv_transfer_params a prefill server
        answered (None: the decode server prefills), and the milliseconds the prefill took
        (None: none was asked)."""
        reason = self.decide(model, body, session)
        params, took = None, None
        if reason == REMOTE:
            began = time.perf_counter()
            params, reason = await self._ask_prefill(model, body, request_id, path, session)
            took = (time.perf_counter() - began) * 1000
            if params is None:  # its KV store may be down: each would be computed twice
                self._backoff_until[model] = time.monotonic() + self.rule.failure_backoff
        self._count(model, REASONS[reason], reason)
        return params, took

    async def _ask_prefill(
        self, model: str, body: Mapping[str, Any], request_id: str, path: str, session: str | None
    ) -> tuple[dict[str, Any] | None, str]:
        """A prefill server's kv_transfer_params for `body` and REMOTE, or None and why not."""
        sent = prefill_body(body)
        try:
            server, resp = await self.prefill.post(model, sent, request_id, path, session)
            try:
                if resp.status_code != 200:
                    await resp.aread()
                    logger.warning("prefill on %s: HTTP %d", server, resp.status_code)
                    return None, "prefill_failed"
                answer = json.loads(await resp.aread())
            finally:
                await resp.aclose()
        except (UpstreamError, httpx.HTTPError, ValueError) as exc:
            logger.warning("prefill failed, decoding with a local prefill: %r", exc)
            return None, "prefill_failed"
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict):
            logger.warning("prefill on %s answered without kv_transfer_params", server)
            return None, "no_params"
        return params, REMOTE

    async def stream(self, job: CompletionJob) -> AsyncGenerator[Delta, None]:
        """`job` on the decode servers, prefilled first where decided; the prefill's time
        is the first and the last delta's `pd-prefill` timing."""
        request_id = job.trace_id or job.request_id
        body = request_body(job)
        params, took = await self._prefilled(job.model, body, request_id, CHAT_PATH, job.session)
        decoded = job if params is None else replace(job, kv_transfer_params=params)
        first = True
        async with contextlib.aclosing(super().stream(decoded)) as deltas:
            async for delta in deltas:
                if took is not None and (first or delta.finish_reason is not None):
                    timings = server_timing.merge({PHASE: took}, delta.timings)
                    delta = replace(delta, timings=timings)
                first = False
                yield delta

    async def post(
        self,
        model: str,
        body: Mapping[str, Any],
        request_id: str,
        path: str = CHAT_PATH,
        session: str | None = None,
    ) -> tuple[str, httpx.Response]:
        """A pass-through on the decode servers, prefilled first where decided (chat and
        text completions); the prefill's time leads the response's Server-Timing."""
        if path not in PREFILLED_PATHS:
            return await super().post(model, body, request_id, path, session)
        params, took = await self._prefilled(model, body, request_id, path, session)
        sent = body if params is None else {**body, "kv_transfer_params": params}
        server, resp = await super().post(model, sent, request_id, path, session)
        if took is not None:
            timings = [server_timing.header({PHASE: took}), resp.headers.get("server-timing")]
            resp.headers["server-timing"] = ", ".join(t for t in timings if t)
        return server, resp

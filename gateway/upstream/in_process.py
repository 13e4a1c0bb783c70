"""The bundled engine, driven by the gateway itself (AsyncLLM; its step loop runs in a child
process, so it never waits on the gateway's event loop for the GIL)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from engine import AsyncLLM, EngineConfig, SamplingParams
from gateway.upstream.base import ChatJob, Delta, EngineGauges, UpstreamError


class InProcessEngine:
    """Admits at most `max_num_seqs + max_waiting` requests at once: past that a request
    gets 429 with Retry-After at once instead of waiting without bound."""

    def __init__(self, config: EngineConfig, max_waiting: int = 256) -> None:
        self.config = config
        self.max_waiting = max_waiting
        self.llm: AsyncLLM | None = None
        self.in_flight = 0

    @property
    def model_id(self) -> str:
        return self.config.model

    async def start(self) -> None:
        self.llm = await asyncio.to_thread(AsyncLLM, self.config)

    async def close(self) -> None:
        if self.llm is not None:
            await asyncio.to_thread(self.llm.shutdown)

    def ready(self) -> bool:
        return self.llm is not None and self.llm.stopped is None

    @property
    def failure(self) -> str | None:
        """Why a loaded engine serves no more (its process died)."""
        return self.llm.stopped if self.llm is not None else None

    def models(self) -> list[str]:
        return [self.model_id]

    @property
    def max_model_len(self) -> int:
        assert self.llm is not None
        return self.llm.max_model_len

    def gauges(self) -> EngineGauges | None:
        if self.llm is None:
            return None
        stats = self.llm.get_stats()
        return EngineGauges(
            running=stats.num_running,
            waiting=stats.num_waiting,
            kv_cache_usage=stats.kv_cache_usage,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            spec_method=stats.spec_method,
            spec_num_drafts=stats.spec_num_drafts,
            spec_draft_tokens=stats.spec_draft_tokens,
            spec_accepted_tokens=stats.spec_accepted_tokens,
        )

    def _params(self, job: ChatJob, prompt_tokens: int) -> SamplingParams:
        limit = self.max_model_len
        room = limit - prompt_tokens
        if room < 1 or (job.max_tokens is not None and job.max_tokens > room):
            asked = f" plus max_tokens ({job.max_tokens})" if job.max_tokens else ""
            raise UpstreamError(
                400,
                f"This model's maximum context length is {limit} tokens; the messages "
                f"({prompt_tokens} tokens){asked} do not fit. Shorten the messages or lower "
                "max_tokens.",
                code="context_length_exceeded",
                param="messages" if room < 1 else "max_tokens",
            )
        try:
            return SamplingParams(
                max_tokens=job.max_tokens or room,
                temperature=job.temperature,
                top_p=job.top_p,
                seed=job.seed,
                stop=list(job.stop),
                ignore_eos=job.ignore_eos,
            )
        except ValueError as exc:
            raise UpstreamError(400, str(exc)) from exc

    async def stream(self, job: ChatJob) -> AsyncGenerator[Delta, None]:
        if self.llm is None:
            raise UpstreamError(503, "the engine is still loading", "service_unavailable")
        if self.in_flight >= self.config.max_num_seqs + self.max_waiting:
            raise UpstreamError(
                429,
                "the engine's queue is full; retry shortly",
                "rate_limit_error",
                code="engine_overloaded",
                retry_after=1,
            )
        try:
            prompt = self.llm.tokenizer.encode(self.llm.tokenizer.apply_chat_template(job.messages))
        except ValueError as exc:  # the chat template refused the messages
            raise UpstreamError(400, str(exc), param="messages") from exc
        params = self._params(job, len(prompt))
        self.in_flight += 1
        try:
            # aclosing: leaving early aborts the engine request now, not when the
            # generator happens to be garbage-collected.
            async with contextlib.aclosing(
                self.llm.generate(
                    prompt, params, request_id=job.request_id, cache_salt=job.cache_salt
                )
            ) as outputs:
                async for out in outputs:
                    if out.delta_text:
                        yield Delta(out.delta_text)
                    if out.finished:
                        yield Delta(
                            finish_reason=out.finish_reason,
                            prompt_tokens=len(out.prompt_token_ids),
                            completion_tokens=len(out.token_ids),
                        )
        except (RuntimeError, ValueError) as exc:  # an engine step failed (logged there)
            raise UpstreamError(500, "the engine failed on this request", "server_error") from exc
        finally:
            self.in_flight -= 1

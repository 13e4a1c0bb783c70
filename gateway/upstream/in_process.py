"""The bundled engine, driven by the gateway itself (AsyncLLM; its step loop runs in a child
process, so it never waits on the gateway's event loop for the GIL, and is restarted if it
dies or hangs: gateway/upstream/core_supervisor.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

from engine import AsyncLLM, EngineConfig, EngineDeadError, RequestMetrics, SamplingParams
from engine.tokenizer import Tokenizer
from gateway.off_loop import run_sized, work_size
from gateway.server_timing import seconds_to_ms
from gateway.upstream.base import (
    CompletionJob,
    Delta,
    EngineGauges,
    Unsupported,
    UpstreamError,
    UpstreamHealth,
)
from gateway.upstream.core_supervisor import CoreSupervisor
from gateway.upstream.engine_support import unsupported

DEFAULT_HANG_SECONDS = 10.0


class InProcessEngine:
    """Admits at most max_num_seqs + `max_waiting` requests at once (see `_admit`): past
    that a request gets 429 with Retry-After at once instead of waiting without bound."""

    cheap_abort = True  # aborted on a hit, a request costs the engine the lookup's time
    forwards = False
    unlisted = False  # its one model is known from the start
    description = "the model"
    awaited = "the model"

    def __init__(
        self,
        config: EngineConfig,
        max_waiting: int = 256,
        observe: Callable[[str, RequestMetrics], None] | None = None,
        hang_seconds: float = DEFAULT_HANG_SECONDS,
    ) -> None:
        self.config = config
        self.max_waiting = max_waiting
        # Given the model and the engine's metrics of each finished request (/metrics).
        self.observe = observe
        self.core = CoreSupervisor(config, hang_seconds)
        self.in_flight = 0

    @property
    def llm(self) -> AsyncLLM | None:
        return self.core.llm

    @property
    def model_id(self) -> str:
        return self.config.model

    async def start(self) -> None:
        await self.core.start()

    async def close(self, reason: str = "engine is shut down") -> None:
        """Shuts the engine down; requests still running fail with `reason` (503)."""
        await self.core.stop(reason)

    def ready(self) -> bool:
        return self.core.ready

    @property
    def failure(self) -> str | None:
        """Why a loaded engine serves no requests now (its core died or hung, and is
        being restarted)."""
        return self.core.down_reason

    @property
    def broken(self) -> bool:
        """Its core could not be restarted, again and again."""
        return self.core.broken

    def models(self) -> list[str]:
        return [self.model_id]

    def servers_of(self, model: str) -> list[str]:
        return []

    def tokenizer(self, model: str) -> Tokenizer | None:
        if model != self.model_id:
            return None
        if self.llm is None:
            raise UpstreamError(
                503, "the model is still loading", "service_unavailable", retry_after=2
            )
        return self.llm.tokenizer

    @property
    def max_model_len(self) -> int:
        assert self.llm is not None
        return self.llm.max_model_len

    def gauges(self) -> EngineGauges | None:
        if self.llm is None:
            return None
        restarts = dict(self.core.restarts)
        if not self.ready():  # the dead core's last numbers are nobody's load now
            return EngineGauges(model=self.model_id, core_restarts=restarts)
        return EngineGauges(
            model=self.model_id,
            stats=self.llm.get_stats(),
            attention_backend=self.llm.attention_backend,
            decode_steps=self.llm.graph_mode,
            core_restarts=restarts,
        )

    def health(self) -> list[UpstreamHealth]:
        return [
            UpstreamHealth("in-process", self.ready(), detail=self.failure, models=(self.model_id,))
        ]

    def _too_long(
        self, job: CompletionJob, prompt_tokens: int, at_least: bool = False
    ) -> UpstreamError:
        limit = self.max_model_len
        asked = f" plus max_tokens ({n})" if (n := job.client_max_tokens) else ""
        tokens = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        what = "messages" if job.prompt is None else "prompt"
        return UpstreamError(
            400,
            f"This model's maximum context length is {limit} tokens; the {what} "
            f"({tokens} tokens){asked} do not fit. Shorten the {what} or lower max_tokens.",
            code="context_length_exceeded",
            param=what if prompt_tokens >= limit else "max_tokens",
        )

    def supports(self, job: CompletionJob) -> Unsupported | None:
        return unsupported(job)

    def refuse_oversized(self, job: CompletionJob) -> None:
        """400 for messages too long by their length alone, or with the client's
        max_tokens: a bound from the longest token (engine/tokenizer.py), so a huge body is
        refused before anything (the cache's hashing, the tokenizer) spends seconds on it,
        and a hit answers such a request as a miss would (400), not with a cached answer."""
        if self.llm is None:
            return
        at_least = self.llm.tokenizer.min_tokens(_chars(job)) + _min_template_tokens(job)
        # An answer needs one token at least, whatever max_tokens the client left out.
        if at_least + (job.client_max_tokens or 1) > self.max_model_len:
            raise self._too_long(job, at_least, at_least=True)

    def _encode(self, job: CompletionJob) -> list[int]:
        assert self.llm is not None
        tokenizer = self.llm.tokenizer
        if isinstance(job.prompt, list):  # the model's own token ids, as vLLM takes them
            vocab = self.llm.vocab_size
            if not all(0 <= t < vocab for t in job.prompt):
                message = f"prompt token ids must be in [0, {vocab}) for this model"
                raise UpstreamError(400, message, param="prompt", code="unsupported_value")
            return list(job.prompt)
        if job.prompt is not None:  # a text completion's: no chat template
            return tokenizer.encode(job.prompt)
        try:
            return tokenizer.encode(tokenizer.apply_chat_template(job.messages))
        except ValueError as exc:  # the chat template refused the messages
            raise UpstreamError(400, str(exc), param="messages") from exc

    def _params(self, job: CompletionJob, prompt_tokens: int) -> SamplingParams:
        room = self.max_model_len - prompt_tokens
        if room < 1 or (job.client_max_tokens or 0) > room:
            raise self._too_long(job, prompt_tokens)
        try:
            return SamplingParams(
                max_tokens=min(job.max_tokens or room, room),
                temperature=job.temperature,
                top_p=job.top_p,
                top_k=job.top_k,
                seed=job.seed,
                stop=list(job.stop),
                ignore_eos=job.ignore_eos,
            )
        except ValueError as exc:
            raise UpstreamError(400, str(exc)) from exc

    def _admit(self) -> None:
        """429 unless the request has a running slot (max_num_seqs) or a place in the
        queue (max_waiting) among the requests in flight.

        Counted here, at admission, not from the engine's reported running count: that
        lags a step or more behind, so in a burst requests that had free slots were
        counted as queued and refused (29 of 300, with 320 places)."""
        if self.in_flight >= self.config.max_num_seqs + self.max_waiting:
            raise UpstreamError(
                429,
                "the engine's queue is full; retry shortly",
                "rate_limit_error",
                code="engine_overloaded",
                retry_after=1,
            )

    async def stream(self, job: CompletionJob) -> AsyncGenerator[Delta, None]:
        if self.llm is None:
            raise UpstreamError(503, "the engine is still loading", "service_unavailable")
        if (down := self.failure) is not None:
            raise _unavailable(down)
        self.refuse_oversized(job)
        self._admit()
        # Counted from admission: a long prompt tokenizing in a thread holds its place.
        self.in_flight += 1
        try:
            prompt = await run_sized(self._encode, job, work_size(job.messages, job.prompt))
            params = self._params(job, len(prompt))
            # aclosing: leaving early aborts the engine request now, not when the
            # generator happens to be garbage-collected.
            async with contextlib.aclosing(
                self.llm.generate(
                    prompt,
                    params,
                    request_id=job.request_id,
                    cache_salt=job.cache_salt,
                    kv_transfer_params=job.kv_transfer_params,
                )
            ) as outputs:
                told = False  # the first text delta tells the phases so far
                async for out in outputs:
                    m = out.metrics
                    if out.delta_text:
                        phases = None if told else _phases(m, finished=False)
                        told = True
                        yield Delta(out.delta_text, timings=phases)
                    if out.finished:
                        # Before the final delta, whose consumer may stop there.
                        if self.observe is not None:
                            self.observe(self.model_id, m)
                        yield Delta(
                            finish_reason=out.finish_reason,
                            prompt_tokens=len(out.prompt_token_ids),
                            completion_tokens=len(out.token_ids),
                            cached_tokens=m.num_cached_tokens,
                            timings=_phases(m, finished=True),
                            kv_transfer_params=out.kv_transfer_params,
                        )
        except EngineDeadError as exc:  # its core died or hung (the supervisor logs it)
            raise _unavailable(str(exc)) from exc
        except (RuntimeError, ValueError) as exc:  # an engine step failed (logged there)
            raise UpstreamError(500, "the engine failed on this request", "server_error") from exc
        finally:
            self.in_flight -= 1


def _unavailable(reason: str) -> UpstreamError:
    return UpstreamError(
        503,
        f"the engine is unavailable: {reason}; retry shortly",
        "service_unavailable",
        code="engine_unavailable",
        retry_after=2,
    )


def _min_template_tokens(job: CompletionJob) -> int:
    """A lower bound of the tokens the chat template adds, so that many empty messages
    count too: one a message (templates mark where each starts), less one (a template
    may fold the system message into the next)."""
    return max(0, len(job.messages) - 1) if job.prompt is None else 0


def _chars(job: CompletionJob) -> int:
    """The prompt's size: characters (token ids: their count), to bound its tokens."""
    if job.prompt is not None:
        return len(job.prompt)
    return sum(len(m["content"]) for m in job.messages)


def _phases(m: RequestMetrics, finished: bool) -> dict[str, float]:
    """The request's phases so far, as Server-Timing names them: queued (arrival to first
    scheduled), prefill (to the first token) and, once finished, decode (to the last)."""
    decode = m.decode_time if finished else None
    return seconds_to_ms(queue=m.queue_time, prefill=m.prefill_time, decode=decode)

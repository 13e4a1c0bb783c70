"""The two front doors: `LLM` (offline batches) and `AsyncLLM` (streams, for servers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from engine.config import EngineConfig
from engine.core_process import (
    AbortRequest,
    AddRequest,
    ClientMessage,
    CoreOutput,
    CoreReady,
    StepReport,
    start_engine_core,
)
from engine.llm_engine import LLMEngine, Prompt, prompt_token_ids
from engine.loaded_model import LoadedModel
from engine.loader import load_tokenizer
from engine.metrics import EngineStats, RequestMetrics
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.step_window import StepWindow

log = logging.getLogger("semgate.engine")

Messages = Sequence[dict[str, Any]]


def _per_prompt(params: SamplingParams | Sequence[SamplingParams], n: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)


class LLM:
    """Offline use: give it prompts, get finished outputs back in the same order."""

    def __init__(
        self, config: EngineConfig | None = None, model: LoadedModel | None = None, **kwargs: Any
    ) -> None:
        self.engine = LLMEngine(config or EngineConfig(**kwargs), model)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        plist = _per_prompt(params or SamplingParams(), len(prompts))
        # Validate every prompt before any runs, so a bad one leaves no half batch.
        seqs = [self.engine.make_sequence(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        for seq in seqs:
            self.engine.add_sequence(seq)
        final: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[s.request_id] for s in seqs]

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache (between runs, as vLLM's LLM.reset_prefix_cache)."""
        return self.engine.reset_prefix_cache()

    def chat(
        self,
        conversations: Messages | Sequence[Messages],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [self.tokenizer.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, params)


class AsyncLLM:
    """The engine for servers: each request is an async stream of deltas.

    The step loop runs in a child process (engine/core_process.py). This side tokenizes
    and validates requests, keeps each request's output so far, and hands the core's
    per-step deltas to the waiting streams from a reader thread. Requests and aborts
    are sent at once; the core applies them between steps.
    """

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        self.config = config or EngineConfig(**kwargs)
        self._process, self._conn = start_engine_core(self.config, log.getEffectiveLevel())
        try:
            self.tokenizer = load_tokenizer(self.config.model_path)  # while the core loads
            ready = self._await_ready()
        except BaseException:
            self._process.kill()  # a no-op once it has exited
            self._process.wait()
            self._conn.close()
            raise
        self.max_model_len = ready.max_model_len
        self.vocab_size = ready.vocab_size
        self._streams: dict[str, _Stream] = {}
        self._stats = EngineStats(spec_method=self.config.spec_method)
        # Kept here, not in the core: an idle core reports nothing, and its window's old
        # steps must still expire as they age.
        self._steps = StepWindow()
        self._send_lock = threading.Lock()
        self._stopped: str | None = None  # why no request is taken any more
        self._reader = threading.Thread(
            target=self._receive, name="semgate-engine-outputs", daemon=True
        )
        self._reader.start()

    def _await_ready(self) -> CoreReady:
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            code = self._process.wait()
            raise RuntimeError(f"the engine process exited while loading (code {code})") from None
        if isinstance(message, BaseException):
            raise message
        return message

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Streams RequestOutputs (deltas) until finished; leaving early aborts the request.
        Only requests with the same `cache_salt` share prefix-cache blocks."""
        if self._stopped:
            raise RuntimeError(self._stopped)
        params = params or SamplingParams()
        token_ids = prompt_token_ids(
            prompt, params, self.tokenizer, self.vocab_size, self.max_model_len
        )
        rid = request_id or uuid.uuid4().hex
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already running")
        stream = _Stream(rid, asyncio.get_running_loop(), token_ids)
        self._streams[rid] = stream
        request = AddRequest(rid, token_ids, params, cache_salt, stream.metrics.arrival_time)
        finished = False
        try:
            self._send(request)
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self.abort(rid)

    async def chat(
        self,
        messages: Messages,
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        async for out in self.generate(
            self.tokenizer.apply_chat_template(messages), params, request_id
        ):
            yield out

    def abort(self, request_id: str) -> None:
        """Ends a request; its KV blocks are freed before the engine's next step."""
        if not self._stopped:
            with contextlib.suppress(RuntimeError):  # a core that is gone frees nothing
                self._send(AbortRequest(request_id))

    @property
    def stopped(self) -> str | None:
        """Why the engine takes no more requests (shut down, or its process died)."""
        return self._stopped

    def get_stats(self) -> EngineStats:
        """The engine's counters and gauges as of its last step; its steps' time over
        the last minute as of now."""
        return replace(self._stats, steps=self._steps.stats())

    def shutdown(self) -> None:
        """Stops the engine process; streams still running fail with RuntimeError."""
        if not self._stopped:
            self._stopped = "engine is shut down"
            with contextlib.suppress(RuntimeError):
                self._send(None)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)  # it ends at the pipe's end of file
        self._conn.close()

    def _send(self, message: ClientMessage) -> None:
        """Raises RuntimeError once the core is gone (the reader thread then says why)."""
        with self._send_lock:  # streams on other threads send too; a message is one write
            try:
                self._conn.send(message)
            except OSError as exc:
                raise RuntimeError(f"the engine process is gone: {exc}") from exc

    def _receive(self) -> None:
        """The reader thread: each step report becomes one callback per event loop."""
        while True:
            try:
                report: StepReport = self._conn.recv()
            except (EOFError, OSError):
                break
            self._stats = report.stats
            if report.step is not None:
                self._steps.add(report.step)
            items: list[tuple[_Stream, RequestOutput | BaseException]] = []
            for out in report.outputs:
                if (stream := self._streams.get(out.request_id)) is not None:
                    items.append((stream, stream.apply(out)))
            for failure in report.failures:
                if (stream := self._streams.get(failure.request_id)) is not None:
                    kind = ValueError if failure.invalid else RuntimeError
                    items.append((stream, kind(failure.message)))
            _deliver(items)
        if not self._stopped:
            self._stopped = f"the engine process exited (code {self._process.wait()})"
            log.error("%s; failing the requests in flight", self._stopped)
        error = RuntimeError(self._stopped)
        _deliver([(stream, error) for stream in list(self._streams.values())])


class _Stream:
    """One request's stream, and its output so far, rebuilt from the core's deltas."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, prompt: list[int]) -> None:
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.prompt_token_ids = prompt
        self.token_ids: list[int] = []
        self.text = ""
        self.metrics = RequestMetrics()

    def apply(self, out: CoreOutput) -> RequestOutput:
        self.token_ids += out.new_token_ids
        self.text += out.delta_text
        token_times = self.metrics.token_times  # kept here: only new times travel
        token_times += out.metrics.token_times
        m = self.metrics = replace(out.metrics, token_times=token_times)
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=list(self.token_ids),
            text=self.text,
            delta_token_ids=out.new_token_ids,
            delta_text=out.delta_text,
            finished=out.finished,
            finish_reason=out.finish_reason,
            stop_reason=out.stop_reason,
            metrics=m,
        )


def _deliver(items: list[tuple[_Stream, RequestOutput | BaseException]]) -> None:
    """Hands items to their streams with one callback per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
    for stream, item in items:
        by_loop.setdefault(stream.loop, []).append((stream, item))
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[_Stream, Any]]) -> None:
    for stream, item in batch:
        stream.queue.put_nowait(item)

"""The two front doors: `LLM` (offline batches) and `AsyncLLM` (streams, for servers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any, Unpack, cast

from engine.config import EngineConfig
from engine.core_process import (
    AbortRequest,
    AddRequest,
    ClientMessage,
    CoreReady,
    Probe,
    StepReport,
    start_engine_core,
)
from engine.llm_engine import LLMEngine, Prompt, prompt_token_ids
from engine.loaded_model import LoadedModel
from engine.loader import load_tokenizer
from engine.metrics import EngineStats
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.sequence import RequestOptions
from engine.sequence import Sequence as EngineSequence
from engine.step_window import StepWindow

log = logging.getLogger("semgate.engine")

Messages = Sequence[dict[str, Any]]


class EngineDeadError(RuntimeError):
    """The engine's core process is gone (it exited, was killed, or was shut down): the
    request failed for that, not for anything in it."""


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
        self.processor = OutputProcessor(self.tokenizer)
        self._transfer_done = threading.Event()
        if self.engine.kv_connector is not None:
            self.engine.kv_connector.on_progress(self._transfer_done.set)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        # One prompt is text, or a list of token ids: a list whose first item is an int.
        one = isinstance(prompts, str) or bool(prompts and isinstance(prompts[0], int))
        batch = [cast(Prompt, prompts)] if one else cast(Sequence[Prompt], prompts)
        plist = _per_prompt(params or SamplingParams(), len(batch))
        # Validate every prompt before any runs, so a bad one leaves no half batch.
        seqs = [self.engine.make_sequence(p, sp) for p, sp in zip(batch, plist, strict=True)]
        for seq in seqs:
            self._add(seq)
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[s.request_id] for s in seqs]

    def add_request(
        self, prompt: Prompt, params: SamplingParams, **options: Unpack[RequestOptions]
    ) -> str:
        """Queues one request (step() runs it); its id."""
        seq = self.engine.make_sequence(prompt, params, **options)
        self._add(seq)
        return seq.request_id

    def _add(self, seq: EngineSequence) -> None:
        prompt = seq.token_ids[: seq.num_prompt_tokens]
        self.processor.add(seq.request_id, prompt, seq.params, seq.metrics.arrival_time)
        try:
            self.engine.add_sequence(seq)
        except ValueError:
            self.processor.forget(seq.request_id)
            raise

    def step(self) -> list[RequestOutput]:
        """One engine step: each request that got tokens, as its output so far."""
        outputs = []
        for out in self.engine.step():
            processed = self.processor.process(out)
            if processed is None:
                continue
            if processed.abort:  # a stop string ended it
                self.engine.abort(out.request_id)
            outputs.append(processed.output)
        if self.engine.last_step is None and self.engine.waits_on_transfers():
            # Nothing could run: wait for the KV connector rather than spin.
            self._transfer_done.wait(0.05)
            self._transfer_done.clear()
        return outputs

    def close(self) -> None:
        """Stops the engine's KV store threads, if it has a store."""
        self.engine.close()

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache (between runs, as vLLM's LLM.reset_prefix_cache)."""
        return self.engine.reset_prefix_cache()

    def chat(
        self,
        conversations: Messages | Sequence[Messages],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        one = bool(conversations and isinstance(conversations[0], dict))  # a list of messages
        batch = [cast(Messages, conversations)] if one else cast(Sequence[Messages], conversations)
        prompts = [self.tokenizer.apply_chat_template(c) for c in batch]
        return self.generate(prompts, params)


class AsyncLLM:
    """The engine for servers: each request is an async stream of deltas.

    The step loop runs in a child process (engine/core_process.py). This side tokenizes
    and validates requests, and a reader thread turns the core's per-step new tokens
    into each stream's outputs (text, stop strings: engine/output_processor.py). Requests and aborts
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
        self.attention_backend = ready.attention_backend
        self.graph_mode = ready.graph_mode
        self.processor = OutputProcessor(self.tokenizer)
        self._streams: dict[str, _Stream] = {}
        self._stats = EngineStats(spec_method=self.config.spec_method)
        # Kept here, not in the core: an idle core reports nothing, and its window's old
        # steps must still expire as they age.
        self._steps = StepWindow()
        self._send_lock = threading.Lock()
        self._stopped: str | None = None  # why no request is taken any more
        # Requests the core holds (sent, not reported finished), and when it last showed
        # progress: its last report, or the moment work reached it while idle. An idle
        # core reports nothing, so only silence with work pending means a hang.
        self._pending: set[str] = set()
        self._progress = time.monotonic()
        self._probed_at: float | None = None  # an idle core was probed then, no report since
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
        **options: Unpack[RequestOptions],
    ) -> AsyncGenerator[RequestOutput, None]:
        """Streams RequestOutputs (deltas) until finished; leaving early aborts the request."""
        if self._stopped:
            raise EngineDeadError(self._stopped)
        params = params or SamplingParams()
        token_ids = prompt_token_ids(
            prompt, params, self.tokenizer, self.vocab_size, self.max_model_len
        )
        rid = options.get("request_id") or uuid.uuid4().hex
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already running")
        stream = _Stream(asyncio.get_running_loop())
        self._streams[rid] = stream
        state = self.processor.add(rid, token_ids, params)
        salt, kv = options.get("cache_salt"), options.get("kv_transfer_params")
        request = AddRequest(rid, token_ids, params, salt, state.metrics.arrival_time, kv)
        finished = False
        if not self._pending:
            self._progress = time.monotonic()
        self._pending.add(rid)
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
            self.processor.forget(rid)
            self._pending.discard(rid)
            if not finished:
                self.abort(rid)

    async def chat(
        self,
        messages: Messages,
        params: SamplingParams | None = None,
        **options: Unpack[RequestOptions],
    ) -> AsyncGenerator[RequestOutput, None]:
        prompt = self.tokenizer.apply_chat_template(messages)
        async for out in self.generate(prompt, params, **options):
            yield out

    def abort(self, request_id: str) -> None:
        """Ends a request; its KV blocks are freed before the engine's next step."""
        self._pending.discard(request_id)
        if not self._stopped:
            with contextlib.suppress(RuntimeError):  # a core that is gone frees nothing
                self._send(AbortRequest(request_id))

    @property
    def stopped(self) -> str | None:
        """Why the engine takes no more requests (shut down, or its process died)."""
        return self._stopped

    def stalled_for(self) -> float:
        """Seconds the core has shown no progress while holding requests, or has not
        answered a probe while idle (else 0)."""
        if self._pending:
            return time.monotonic() - self._progress
        probed_at = self._probed_at
        return 0.0 if probed_at is None else time.monotonic() - probed_at

    def probe(self) -> None:
        """Asks an idle core to report, so that a hang shows before a request waits on it
        (stalled_for); one probe at a time. A busy core's reports are its progress.

        Never blocks (the thread that probes is the one that kills a hung core): while
        another send is under way it probes next time; a pipe too full to write to
        counts as a probe out, as the core reads its pipe even during a step."""
        if self._stopped or self._pending or self._probed_at is not None:
            return
        _, writable, _ = select.select([], [self._conn.fileno()], [], 0)
        if not writable:
            self._probed_at = time.monotonic()
            return
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            self._probed_at = time.monotonic()
            with contextlib.suppress(OSError):  # gone: the reader thread says why
                self._conn.send(Probe())
        finally:
            self._send_lock.release()

    def kill_core(self, reason: str) -> None:
        """Kills the core process (a hung one); its streams fail with `reason`."""
        self._stopped = self._stopped or reason
        self._process.kill()

    def get_stats(self) -> EngineStats:
        """The engine's counters and gauges as of its last step; its steps' time over
        the last minute as of now."""
        return replace(self._stats, steps=self._steps.stats())

    def shutdown(self, reason: str = "engine is shut down") -> None:
        """Stops the engine process; streams still running fail with EngineDeadError."""
        if not self._stopped:
            self._stopped = reason
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
                raise EngineDeadError(f"the engine process is gone: {exc}") from exc

    def _receive(self) -> None:
        """The reader thread: each step report becomes one callback per event loop."""
        while True:
            try:
                report: StepReport = self._conn.recv()
            except (EOFError, OSError):
                break
            self._progress, self._probed_at = time.monotonic(), None
            self._stats = report.stats
            if report.step is not None:
                self._steps.add(report.step)
            items: list[tuple[_Stream, RequestOutput | BaseException]] = []
            for out in report.outputs:
                if out.finished:
                    self._pending.discard(out.request_id)
                processed = self.processor.process(out)
                if processed is None:
                    continue
                if processed.abort:  # a stop string ended it
                    self.abort(out.request_id)
                if (stream := self._streams.get(out.request_id)) is not None:
                    items.append((stream, processed.output))
            for failure in report.failures:
                self.processor.forget(failure.request_id)
                self._pending.discard(failure.request_id)
                if (stream := self._streams.get(failure.request_id)) is not None:
                    kind = ValueError if failure.invalid else RuntimeError
                    items.append((stream, kind(failure.message)))
            _deliver(items)
        if not self._stopped:
            self._stopped = f"the engine process exited (code {self._process.wait()})"
            log.error("%s; failing the requests in flight", self._stopped)
        error = EngineDeadError(self._stopped)
        _deliver([(stream, error) for stream in list(self._streams.values())])


class _Stream:
    """Where one request's outputs go: a queue read on its caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()


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

"""The two front doors: `LLM` (offline batches) and `AsyncLLM` (streams, for servers)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

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

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        self.engine = LLMEngine(config or EngineConfig(**kwargs))
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
    """The engine on a background thread; each request is an async stream of deltas.

    Requests and aborts go through thread-safe queues that the engine thread
    drains between steps, so callers never block on a running step.
    """

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        self.engine = LLMEngine(config or EngineConfig(**kwargs))
        self.tokenizer = self.engine.tokenizer
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="semgate-engine", daemon=True)
        self._thread.start()

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
            raise RuntimeError("engine is shut down")
        seq = self.engine.make_sequence(prompt, params or SamplingParams(), request_id, cache_salt)
        rid = seq.request_id
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already running")
        stream: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), stream)
        self._send("add", seq)
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._send("abort", rid)

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
        self._send("abort", request_id)

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)

    def _send(self, kind: str, payload: Any) -> None:
        self._inbox.put((kind, payload))
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, item)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    self.engine.add_sequence(payload)
                except ValueError as exc:
                    self._deliver(payload.request_id, exc)
            else:
                out = self.engine.abort(payload)
                if out is not None:
                    self._deliver(payload, out)

    def _run(self) -> None:
        self.engine.claim_threads()
        while not self._stopped:
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # keep serving: fail the requests in flight, not the thread
                log.exception("engine step failed; aborting the requests in flight")
                for rid in list(self.engine.sequences):
                    self.engine.abort(rid)
                    self._deliver(rid, RuntimeError(f"engine step failed: {exc}"))
                continue
            for out in outputs:
                self._deliver(out.request_id, out)

"""The front end's side of a request: its output so far, text and stop strings.

The engine core's step loop only appends token ids and stops requests at EOS or their
length; everything else about an output happens here, in the process that asked
(as in vLLM V1's output processor): detokenizing, matching stop strings, keeping the
tokens and timings so far. A step then costs the core no Python per token beyond
the append, and only each step's new token ids cross from the core.

A stop string ends a request here first: its output is cut at the stop string and
finished, and the caller aborts it in the core (`Processed.abort`), which may have
computed a token or two past it meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import NamedTuple

from engine.detokenizer import IncrementalDetokenizer
from engine.metrics import RequestMetrics
from engine.outputs import CoreOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer


class RequestState:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        detokenizer: IncrementalDetokenizer,
        arrival_time: float,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.detokenizer = detokenizer
        self.token_ids: list[int] = []
        self.metrics = RequestMetrics(arrival_time=arrival_time)


class Processed(NamedTuple):
    output: RequestOutput
    abort: bool  # a stop string ended it before the core did: abort it there


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> RequestState:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        detokenizer = IncrementalDetokenizer(self.tokenizer, params.stop)
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        state = RequestState(request_id, prompt_token_ids, detokenizer, arrival)
        self.requests[request_id] = state
        return state

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def process(self, out: CoreOutput) -> Processed | None:
        """The request's output after this step's tokens (None for a request this side
        has finished or forgotten)."""
        state = self.requests.get(out.request_id)
        if state is None:
            return None
        new = out.new_token_ids
        finished, reason, stop = out.finished, out.finish_reason, None
        # The core ends a request with finish_reason "stop" at an EOS token only: that
        # token is kept in token_ids but is no text.
        text_tokens = new[:-1] if reason == "stop" else new
        for i, token in enumerate(text_tokens):
            stop = state.detokenizer.add(token)
            if stop is not None:
                new = new[: i + 1]
                finished, reason = True, "stop"
                break
        state.token_ids += new
        metrics = state.metrics
        if out.metrics is not None:  # the core's counters: with the first tokens, and last
            metrics = state.metrics = replace(
                out.metrics, arrival_time=metrics.arrival_time, token_times=metrics.token_times
            )
        metrics.token_times += [out.time] * len(new)
        if finished:
            if metrics.finished_time is None:
                metrics.finished_time = time.perf_counter()
            self.requests.pop(out.request_id, None)
        output = RequestOutput(
            request_id=state.request_id,
            prompt_token_ids=state.prompt_token_ids,
            token_ids=state.token_ids,
            text=state.detokenizer.text,
            delta_token_ids=new,
            delta_text=state.detokenizer.take_delta(finished),
            finished=finished,
            finish_reason=reason,
            stop_reason=stop,
            metrics=metrics,
            kv_transfer_params=out.kv_transfer_params,
        )
        return Processed(output, abort=stop is not None and not out.finished)

"""What the gateway asks of whatever answers a cache miss: the in-process engine, or
remote OpenAI-compatible servers. Both speak in `CompletionJob`s in and `Delta`s out; each
says which jobs it can serve (`supports`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from engine.metrics import EngineStats
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from gateway.errors import APIError


@dataclass(frozen=True)
class CompletionJob:
    """A validated chat or text completion request, as an upstream runs it (built by
    gateway/job_translation.py). `messages` hold plain-string content (text parts are
    joined by the gateway); max_tokens None means "up to the context length". `prompt`
    (text completions, in-process engine only: upstreams get those requests' bodies as
    received) is run as it is, text or the model's token ids, instead of `messages`
    through the chat template. `fields` is the request as the client set it, by OpenAI's
    names (plain values): what `supports` reads, and what remote servers are sent beyond
    the typed fields (gateway/upstream/http.py)."""

    request_id: str
    model: str
    messages: list[dict[str, str]]
    max_tokens: int | None = None
    # max_tokens is the gateway's default cap (the client set none; gateway/
    # job_translation.py): a prompt that leaves less room gets the room, not a 400, and
    # remote servers are not sent it (their context is not known here): their streams are
    # cut at it instead (gateway/upstream/openai_wire.py).
    default_cap: bool = False
    # Unsent, the engine's defaults (OpenAI's too).
    temperature: float = SamplingParams.temperature
    top_p: float = SamplingParams.top_p
    top_k: int = SamplingParams.top_k  # vLLM's extension: 0 is off
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens (benchmarks, tests)
    cache_salt: str | None = None  # vLLM's extension: prefix-cache blocks shared only within
    # vLLM's P/D protocol (gateway/schemas.py): sent to the server that runs the job.
    kv_transfer_params: dict[str, Any] | None = None
    prompt: str | list[int] | None = None
    # The request's X-Request-Id (the client's own when it sent one): remote servers are
    # sent it, so that their logs name the request as the client's and the gateway's do.
    trace_id: str | None = None
    # Keeps the request on the server of its session's earlier ones (X-Session-Id, else
    # the `user` field; gateway/upstream/balancer.py).
    session: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def client_max_tokens(self) -> int | None:
        """max_tokens as the client asked it: None where it asked none."""
        return None if self.default_cap else self.max_tokens


@dataclass(frozen=True)
class Unsupported:
    """What an upstream cannot honour in a job: the request's field (`param`) and why,
    which the client gets as a 400 naming the field."""

    param: str
    message: str


@dataclass(frozen=True)
class Delta:
    """One step of an answer. The last delta has `finish_reason` and the usage."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Of prompt_tokens, those served from cache (a prefix cache's KV blocks, or a cached
    # answer: all of them); None where unknown (an upstream that does not say).
    cached_tokens: int | None = None
    # Where the answer's time went upstream, in milliseconds by Server-Timing name
    # (gateway/server_timing.py): on the first delta what is known by then (the engine's
    # queue and prefill), complete on the last one; None on the others.
    timings: dict[str, float] | None = None
    # The remote server answering (its base URL), on the first delta; None elsewhere
    # and for the in-process engine.
    upstream: str | None = None
    # On the last delta: what a prefill server answers to `do_remote_decode` (vLLM's P/D
    # protocol), for the decode server; None otherwise.
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class EngineGauges:
    """The in-process engine's load, for /metrics and /admin/engine/stats (remote engines
    export their own): the engine's own stats, and what only the gateway knows."""

    model: str  # the served model id: vLLM's `model_name` label
    # Its counters, gauges and last minute's steps; None while its core is down (the
    # dead core's last numbers are nobody's load now).
    stats: EngineStats | None = None
    attention_backend: str = ""  # the engine's (engine/attention_backends.py)
    decode_steps: str = ""  # how decode steps run: eagerly, or as CUDA graphs of which sizes
    core_restarts: dict[str, int] = field(default_factory=dict)  # by cause: exited, hung


@dataclass(frozen=True)
class UpstreamHealth:
    """One server answering misses, as the gateway last saw it, for /metrics."""

    name: str  # its base URL, or "in-process"
    up: bool
    # Its engine's own counts, read from its /metrics (semgate's or vLLM's names);
    # None where it exports neither.
    running: int | None = None
    waiting: int | None = None
    detail: str | None = None  # why it is not used, while it is down
    # How the gateway routes to it (gateway/upstream/balancer.py): its requests in flight
    # from this gateway, its weight, the requests sent to it by reason since the start,
    # and the prompt-start blocks remembered for it.
    in_flight: int = 0
    weight: float = 1.0
    requests: Mapping[str, int] = field(default_factory=dict)
    prefix_blocks: int = 0
    models: tuple[str, ...] = ()  # what it serves (its group's model, or those it lists)
    policy: str | None = None  # its group's routing policy; None for the in-process engine
    # What it is sent (gateway/upstream/disaggregation.py): "prefill" (the prompts its
    # model's decode servers have prefilled elsewhere), "decode", or "both" (whole requests).
    role: str = "both"


class UpstreamError(APIError):
    """An upstream refused or failed a request (same fields as APIError)."""


@runtime_checkable  # Litestar checks injected values against the annotation
class Upstream(Protocol):
    # Whether starting a request and aborting it at once costs next to nothing (no
    # remote request, no other server's work): then misses are started while the cache
    # is asked, and a hit aborts them.
    cheap_abort: bool
    # What answers misses, as the start-up log names it ("the model", "the upstreams"),
    # and what chat waits for until ready() ("the model", "an upstream").
    description: str
    awaited: str

    @property
    def forwards(self) -> bool:
        """Whether remote servers answer its requests: then it is a `Forwarder`, which
        takes pass-throughs as they came; else the gateway runs its model itself."""

    async def start(self) -> None:
        """Loads or connects; may take a while (the gateway is not ready until done)."""

    async def close(self) -> None: ...

    def ready(self) -> bool: ...

    @property
    def failure(self) -> str | None:
        """Why it serves no more after it started (its engine process died); None if it
        does, or may again (remote servers are probed until they answer)."""

    def tokenizer(self, model: str) -> Tokenizer | None:
        """`model`'s tokenizer where this gateway runs the model itself, else None (token
        counts are then unknown). Raises UpstreamError (503) while that model loads."""

    def models(self) -> list[str]:
        """Model ids it serves; the first is the default."""

    @property
    def unlisted(self) -> bool:
        """Whether it may serve models it has not listed yet (servers whose models are
        discovered, before they first answered): an unknown model may be its."""

    def servers_of(self, model: str) -> list[str]:
        """The base URLs of the remote servers that serve `model` (none in-process)."""

    def gauges(self) -> EngineGauges | None: ...

    def health(self) -> list[UpstreamHealth]:
        """Each server's state, in the order configured."""

    def supports(self, job: CompletionJob) -> Unsupported | None:
        """What of `job` it cannot honour (None: it can run it as it is)."""

    def refuse_oversized(self, job: CompletionJob) -> None:
        """Raises UpstreamError for a request it can tell will not fit without tokenizing
        it (called before the cache does any work on the request)."""

    def stream(self, job: CompletionJob) -> AsyncGenerator[Delta, None]:
        """The answer as deltas. Raises UpstreamError before the first delta for requests
        it refuses (context length, queue full, no healthy server); closing the iterator
        early aborts the request upstream."""


class Forwarder(Upstream, Protocol):
    """An upstream that `forwards`: request bodies go to its servers as they came."""

    async def post(
        self,
        model: str,
        body: Mapping[str, Any],
        request_id: str,
        path: str = "/v1/chat/completions",
        session: str | None = None,
    ) -> tuple[str, httpx.Response]:
        """The response (head read, body not: the caller reads and closes it) of a
        server of `model` to `body` POSTed to `path`, and that server's base URL."""
        ...

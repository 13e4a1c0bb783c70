"""How an `Answer` (gateway/chat_service.py) goes on the wire, for chat and text
completions alike: one JSON response, or an SSE stream of chunks ending with [DONE]. Both
carry the X-Cache-* headers and the Server-Timing: a JSON answer's header has all its
timings; a stream's header has what was known as it started, and its last chunk's
`timings` the rest. What differs between the two APIs (their types, chat's role chunk,
a text completion's echoed prompt) is an `AnswerShape`."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
from litestar import Response
from litestar.response import ServerSentEvent

from gateway import server_timing
from gateway.chat_service import Answer
from gateway.disconnect import DisconnectWatch
from gateway.errors import APIError
from gateway.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    CompletionChoice,
    CompletionRequest,
    DeltaMessage,
    ResponseMessage,
    TextCompletion,
    Usage,
)
from gateway.upstream import Delta

log = logging.getLogger("semgate.gateway")

ChoiceT = TypeVar("ChoiceT", covariant=True)
WholeT = TypeVar("WholeT", covariant=True)


class AnswerShape(Protocol[ChoiceT, WholeT]):
    """One API's answer types: its stream's chunks and choices, and its JSON answer."""

    def opening(self) -> ChoiceT | None:
        """The first chunk's choice, if the stream has one before the answer's text."""

    def choice(self, text: str | None, finish: str | None = None) -> ChoiceT:
        """A chunk's choice: a piece of the text, or (text None) the finish_reason."""

    @property
    def chunk_type(self) -> Callable[..., msgspec.Struct]:
        """A stream's chunk, built as (id, created, model, choices, usage=, timings=)."""

    def whole(self, answer: Answer, text: str, final: Delta | None) -> WholeT:
        """The JSON answer: its text, and what its final delta says (None: none came)."""


class ChatShape:
    """Chat: the answer is the assistant's message; its stream opens with the role."""

    chunk_type = ChatCompletionChunk

    def opening(self) -> ChunkChoice:
        return ChunkChoice(0, DeltaMessage(role="assistant", content=""))

    def choice(self, text: str | None, finish: str | None = None) -> ChunkChoice:
        return ChunkChoice(0, DeltaMessage(content=text), finish)

    def whole(self, answer: Answer, text: str, final: Delta | None) -> ChatCompletion:
        choice = Choice(0, ResponseMessage("assistant", text), _finish_of(final))
        usage, kv = _usage_of(final), _kv_transfer_params_of(final)
        return ChatCompletion(
            answer.id, answer.created, answer.model, [choice], usage, kv_transfer_params=kv
        )


@dataclass(frozen=True)
class TextShape:
    """A text completion: the answer is text, after the prompt when it is `echo`ed."""

    echo: str = ""
    chunk_type = TextCompletion

    def opening(self) -> CompletionChoice | None:
        return CompletionChoice(0, self.echo) if self.echo else None

    def choice(self, text: str | None, finish: str | None = None) -> CompletionChoice:
        return CompletionChoice(0, text or "", finish)

    def whole(self, answer: Answer, text: str, final: Delta | None) -> TextCompletion:
        choice = CompletionChoice(0, self.echo + text, _finish_of(final))
        usage, kv = _usage_of(final), _kv_transfer_params_of(final)
        return TextCompletion(
            answer.id, answer.created, answer.model, [choice], usage=usage, kv_transfer_params=kv
        )


async def render_answer(
    answer: Answer,
    shape: AnswerShape[Any, WholeT],
    request: ChatCompletionRequest | CompletionRequest,
    watch: DisconnectWatch,
    upstream_header: bool,
) -> Response[WholeT] | ServerSentEvent:
    """`answer` as `request` asked (JSON, or SSE with `stream`), with the cache's headers
    and X-Upstream (the remote server answering) if
    `upstream_header`. A JSON answer is collected under `watch` (ClientDisconnected if
    the client leaves first); a stream is not (it notices a closed connection itself)."""
    head = {"X-Cache-Status": answer.cache_status.capitalize(), **answer.headers}
    if upstream_header and answer.upstream is not None:
        head["X-Upstream"] = answer.upstream
    if request.stream:
        # What is known before the answer: the lookup, the engine's queue and prefill.
        if answer.timings:
            head["Server-Timing"] = server_timing.header(answer.timings)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        events = _ended(_events(answer, shape, include_usage), answer.deltas)
        return ServerSentEvent(events, headers=head)
    whole, timings = await watch.run(_collect(answer, shape))
    if timings:
        head["Server-Timing"] = server_timing.header(timings)
    return Response(whole, headers=head)


async def _collect(
    answer: Answer, shape: AnswerShape[Any, WholeT]
) -> tuple[WholeT, server_timing.Timings]:
    """The whole answer, and its timings (the final delta's)."""
    parts: list[str] = []
    final: Delta | None = None
    async for delta in answer.deltas:
        parts.append(delta.text)
        if delta.finish_reason is not None:
            final = delta
    whole = shape.whole(answer, "".join(parts), final)
    return whole, (final.timings if final else None) or {}


async def _events(
    answer: Answer, shape: AnswerShape[ChoiceT, Any], include_usage: bool
) -> AsyncIterator[str]:
    """OpenAI's chunk sequence: the opening (chat's role, an echoed prompt), the text
    deltas, the finish_reason, the usage (if asked). The last chunk (the usage, else the
    finish_reason) carries the answer's timings."""

    def chunk(
        choices: list[ChoiceT],
        usage: Usage | None = None,
        timings: server_timing.Timings | msgspec.UnsetType = msgspec.UNSET,
    ) -> str:
        event = shape.chunk_type(
            answer.id, answer.created, answer.model, choices, usage=usage, timings=timings
        )
        return msgspec.json.encode(event).decode()

    if (opening := shape.opening()) is not None:
        yield chunk([opening])
    final: Delta | None = None
    async for delta in answer.deltas:
        if delta.text:
            yield chunk([shape.choice(delta.text)])
        if delta.finish_reason is not None:
            final = delta
            # The timings go on the last chunk: this one, unless a usage chunk follows.
            timings = msgspec.UNSET if include_usage else _timings_of(final)
            yield chunk([shape.choice(None, delta.finish_reason)], timings=timings)
    if include_usage:
        yield chunk([], _usage_of(final), _timings_of(final))


def _finish_of(final: Delta | None) -> str | None:
    return final.finish_reason if final is not None else None


def _kv_transfer_params_of(final: Delta | None) -> dict[str, Any] | msgspec.UnsetType:
    """The JSON answer's `kv_transfer_params`: absent unless a prefill server gave some."""
    if final is None or final.kv_transfer_params is None:
        return msgspec.UNSET
    return final.kv_transfer_params


def _usage_of(final: Delta | None) -> Usage:
    if final is None:
        return Usage.of(None, None, None)
    return Usage.of(final.prompt_tokens, final.completion_tokens, final.cached_tokens)


def _timings_of(final: Delta | None) -> server_timing.Timings | msgspec.UnsetType:
    """The final chunk's `timings` object: absent when there are none."""
    if final is None or not final.timings:
        return msgspec.UNSET
    return server_timing.rounded(final.timings)


async def _ended(
    events: AsyncIterator[str], deltas: AsyncGenerator[Delta, None]
) -> AsyncIterator[str]:
    """`events`, then [DONE]. A failure after the first event (the status line is sent)
    becomes an error event, never a silent end; the answer's deltas are closed however
    the stream ends (the client leaving included)."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield exc.event().decode()
    except Exception as exc:
        log.exception("stream failed")
        yield APIError(500, f"the answer failed mid-stream: {exc}", "server_error").event().decode()
    finally:
        await deltas.aclose()
    yield "[DONE]"

"""POST /v1/chat/completions (on the /v1 router, gateway/app.py): JSON or SSE, with the
cache status and the Server-Timing in the headers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Response, post
from litestar.params import Parameter
from litestar.response import ServerSentEvent, Stream

from gateway import server_timing
from gateway.bypass import bypass_reason
from gateway.completions import Answer, CacheDirectives, ChatService
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import CLIENT_CLOSED_REQUEST
from gateway.openapi_docs import CHAT_RESPONSES, AnswerOperation
from gateway.request_id import request_id
from gateway.runtime import Runtime
from gateway.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    DeltaMessage,
    ResponseMessage,
)
from gateway.streamed_answer import ended, timings_of, usage_of
from gateway.strict_json import StrictJSON
from gateway.upstream import Delta
from gateway.upstream.balancer import SESSION_HEADER


async def _collect(answer: Answer) -> tuple[ChatCompletion, server_timing.Timings]:
    """The whole answer, and its timings (the final delta's)."""
    parts: list[str] = []
    final: Delta | None = None
    async for delta in answer.deltas:
        parts.append(delta.text)
        if delta.finish_reason is not None:
            final = delta
    message = ResponseMessage("assistant", "".join(parts))
    finish = final.finish_reason if final else None
    completion = ChatCompletion(
        answer.id, answer.created, answer.model, [Choice(0, message, finish)], usage_of(final)
    )
    return completion, (final.timings if final else None) or {}


async def _events(answer: Answer, include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's chunk sequence: role, content deltas, finish_reason, usage (if asked);
    `ended` adds [DONE]. The last chunk before it (the usage, else the finish_reason)
    carries the answer's timings."""

    def chunk(
        delta: DeltaMessage,
        finish: str | None = None,
        timings: server_timing.Timings | msgspec.UnsetType = msgspec.UNSET,
    ) -> str:
        choice = ChunkChoice(0, delta, finish)
        return msgspec.json.encode(
            ChatCompletionChunk(answer.id, answer.created, answer.model, [choice], timings=timings)
        ).decode()

    yield chunk(DeltaMessage(role="assistant", content=""))
    final: Delta | None = None
    async for delta in answer.deltas:
        if delta.text:
            yield chunk(DeltaMessage(content=delta.text))
        if delta.finish_reason is not None:
            final = delta
            # The timings go on the last chunk: this one, unless a usage chunk follows.
            timings = msgspec.UNSET if include_usage else timings_of(final)
            yield chunk(DeltaMessage(), delta.finish_reason, timings)
    if include_usage:
        usage = ChatCompletionChunk(
            answer.id,
            answer.created,
            answer.model,
            [],
            usage=usage_of(final),
            timings=timings_of(final),
        )
        yield msgspec.json.encode(usage).decode()


@post(
    "/chat/completions",
    status_code=200,
    summary="Create a chat completion (OpenAI-compatible)",
    description="Answers from the semantic cache when an equivalent question was answered "
    "before (X-Cache-Status: Hit), else from the engine. `stream: true` returns SSE chunks. "
    "With upstreams, what the cache cannot key (tools, logprobs, n > 1, ...) is passed "
    "through as it came (X-Cache-Status: Bypass, X-Cache-Bypass-Reason).",
    tags=["chat"],
    dto=StrictJSON[ChatCompletionRequest],
    return_dto=None,
    responses=CHAT_RESPONSES,
    operation_class=AnswerOperation,
)
async def chat_completions(
    data: ChatCompletionRequest,
    request: Request,
    chat: ChatService,
    runtime: Runtime,
    cache_control: str | None = Parameter(
        header="cache-control",
        default=None,
        description="no-cache (skip the lookup, still store), no-store (neither), max-age=N "
        "(serve only a cached answer at most N seconds old)",
    ),
    session: str | None = Parameter(
        header=SESSION_HEADER.lower(),
        default=None,
        description="keeps the conversation on one upstream server while it is healthy "
        "(without it, the body's `user` does)",
    ),
) -> Response[ChatCompletion] | ServerSentEvent | Response[bytes] | Stream:
    # Not runtime.check_ready(): a hit is answered while the engine is down or restarting
    # (only a miss gets its 503), and nothing waits for Redis (uncached while it is down).
    runtime.check_accepting()
    tenant: str = request.state.tenant  # set by api_key_guard (the /v1 router's)
    ttl = data.cache.ttl if data.cache is not None else None
    directives = CacheDirectives.parse(cache_control, ttl)
    # Until the response starts, a client that hangs up gets its work cancelled (queued,
    # prefilling, or a JSON answer being generated); a stream notices on its own.
    watch = DisconnectWatch(request.receive)
    rid = request_id(request.scope)
    try:
        if runtime.passthrough is not None and runtime.passthrough.serves(data.model):
            # The body as received (decoded strictly into `data` already): what the
            # upstreams get if the cache cannot key it.
            body = msgspec.json.decode(await request.body())
            if (reason := bypass_reason(data, body)) is not None:
                answered = runtime.passthrough.answer(
                    data, body, reason, tenant, rid, session=session
                )
                return await watch.run(answered)
        answer = await watch.run(chat.answer(data, tenant, directives, rid, session))
        headers = {"X-Cache-Status": answer.cache_status.capitalize(), **answer.headers}
        if runtime.settings.upstream_header and answer.upstream is not None:
            headers["X-Upstream"] = answer.upstream
        if data.stream:
            # What is known before the answer: the lookup, the engine's queue and prefill.
            if answer.timings:
                headers["Server-Timing"] = server_timing.header(answer.timings)
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            events = ended(_events(answer, include_usage), answer.deltas)
            return ServerSentEvent(events, headers=headers)
        completion, timings = await watch.run(_collect(answer))
    except ClientDisconnected:
        return Response(None, status_code=CLIENT_CLOSED_REQUEST)
    finally:
        watch.close()
    if timings:
        headers["Server-Timing"] = server_timing.header(timings)
    return Response(completion, headers=headers)

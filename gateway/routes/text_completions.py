"""POST /v1/completions (on the /v1 router, gateway/app.py): OpenAI's legacy text
completions, JSON or SSE, never cached (X-Cache-Status: Bypass, reason `completions`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Response, post
from litestar.params import Parameter
from litestar.response import ServerSentEvent, Stream

from gateway import server_timing
from gateway.completions import Answer, ChatService
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import CLIENT_CLOSED_REQUEST
from gateway.openapi_docs import AnswerOperation, answer_responses
from gateway.request_id import request_id
from gateway.runtime import Runtime
from gateway.schemas import CompletionChoice, CompletionRequest, TextCompletion, Usage
from gateway.streamed_answer import ended, timings_of, usage_of
from gateway.strict_json import StrictJSON
from gateway.text_completions import BYPASS_REASON, PATH, echo_text, to_text_job
from gateway.upstream import Delta
from gateway.upstream.balancer import SESSION_HEADER


async def _collect(answer: Answer, echo: str) -> tuple[TextCompletion, server_timing.Timings]:
    parts = [echo]
    final: Delta | None = None
    async for delta in answer.deltas:
        parts.append(delta.text)
        if delta.finish_reason is not None:
            final = delta
    choice = CompletionChoice(0, "".join(parts), final.finish_reason if final else None)
    completion = TextCompletion(
        answer.id, answer.created, answer.model, [choice], usage=usage_of(final)
    )
    return completion, (final.timings if final else None) or {}


async def _events(answer: Answer, include_usage: bool, echo: str) -> AsyncIterator[str]:
    """As chat's chunks (gateway/routes/chat.py), with text: the echoed prompt first, if
    asked, the text deltas, the finish_reason, the usage if asked; `ended` adds [DONE]."""

    def chunk(
        choices: list[CompletionChoice],
        usage: Usage | None = None,
        timings: server_timing.Timings | msgspec.UnsetType = msgspec.UNSET,
    ) -> str:
        event = TextCompletion(
            answer.id, answer.created, answer.model, choices, usage=usage, timings=timings
        )
        return msgspec.json.encode(event).decode()

    if echo:
        yield chunk([CompletionChoice(0, echo)])
    final: Delta | None = None
    async for delta in answer.deltas:
        if delta.text:
            yield chunk([CompletionChoice(0, delta.text)])
        if delta.finish_reason is not None:
            final = delta
            # The timings go on the last chunk: this one, unless a usage chunk follows.
            timings = msgspec.UNSET if include_usage else timings_of(final)
            yield chunk([CompletionChoice(0, "", delta.finish_reason)], timings=timings)
    if include_usage:
        yield chunk([], usage_of(final), timings_of(final))


@post(
    "/completions",
    status_code=200,
    summary="Create a text completion (OpenAI's legacy Completions API)",
    description="Continues the prompt as it is (no chat template), from the engine; never "
    "cached (X-Cache-Status: Bypass, X-Cache-Bypass-Reason: completions). `stream: true` "
    "returns SSE chunks. With upstreams the body is forwarded to them as received.",
    tags=["completions"],
    dto=StrictJSON[CompletionRequest],
    return_dto=None,
    responses=answer_responses(TextCompletion),
    operation_class=AnswerOperation,
)
async def text_completions(
    data: CompletionRequest,
    request: Request,
    chat: ChatService,
    runtime: Runtime,
    session: str | None = Parameter(
        header=SESSION_HEADER.lower(),
        default=None,
        description="keeps the session on one upstream server while it is healthy",
    ),
) -> Response[TextCompletion] | ServerSentEvent | Response[bytes] | Stream:
    runtime.check_ready()
    tenant: str = request.state.tenant  # set by api_key_guard (the /v1 router's)
    # Until the response starts, a client that hangs up gets its work cancelled.
    watch = DisconnectWatch(request.receive)
    try:
        if runtime.passthrough is not None and runtime.passthrough.serves(data.model):
            body = msgspec.json.decode(await request.body())
            rid = request_id(request.scope)
            answered = runtime.passthrough.answer(
                data, body, BYPASS_REASON, tenant, rid, PATH, session
            )
            return await watch.run(answered)
        job = to_text_job(data, runtime.upstream.models(), tenant)
        echo = echo_text(job, runtime.upstream) if data.echo else ""
        answer = await watch.run(chat.uncached(job, BYPASS_REASON))
        headers = {"X-Cache-Status": "Bypass", "X-Cache-Bypass-Reason": BYPASS_REASON}
        if data.stream:
            if answer.timings:
                headers["Server-Timing"] = server_timing.header(answer.timings)
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            events = ended(_events(answer, include_usage, echo), answer.deltas)
            return ServerSentEvent(events, headers=headers)
        completion, timings = await watch.run(_collect(answer, echo))
    except ClientDisconnected:
        return Response(None, status_code=CLIENT_CLOSED_REQUEST)
    finally:
        watch.close()
    if timings:
        headers["Server-Timing"] = server_timing.header(timings)
    return Response(completion, headers=headers)

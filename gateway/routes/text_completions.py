"""POST /v1/completions (on the /v1 router, gateway/app.py): OpenAI's legacy text
completions, JSON or SSE, never cached (X-Cache-Status: Bypass, reason `completions`)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, post
from litestar.params import Parameter
from litestar.response import ServerSentEvent, Stream

from gateway.answer_rendering import TextShape, render_answer
from gateway.chat_service import ChatService
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import CLIENT_CLOSED_REQUEST
from gateway.job_translation import echo_text, text_job
from gateway.openapi_docs import TextAnswerOperation, answer_responses
from gateway.request_id import request_id
from gateway.runtime import Runtime
from gateway.schemas import CompletionRequest, TextCompletion
from gateway.strict_json import StrictJSON
from gateway.upstream.balancer import SESSION_HEADER

# A prompt to continue is not a question: never cached (X-Cache-Bypass-Reason, and the
# bypass counter's label).
BYPASS_REASON = "completions"
PATH = "/v1/completions"


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
    operation_class=TextAnswerOperation,
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
) -> Response[TextCompletion] | ServerSentEvent | Response[bytes] | Stream | Response[None]:
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
        job = text_job(data, runtime.upstream.models(), tenant, chat.default_max_tokens)
        echo = echo_text(job, runtime.upstream) if data.echo else ""
        answer = await watch.run(chat.uncached(job, BYPASS_REASON))
        upstream_header = runtime.settings.upstream_header
        return await render_answer(answer, TextShape(echo), data, watch, upstream_header)
    except ClientDisconnected:
        return Response(None, status_code=CLIENT_CLOSED_REQUEST)
    finally:
        watch.close()

"""POST /v1/chat/completions (on the /v1 router, gateway/app.py): JSON or SSE, with the
cache status and the Server-Timing in the headers."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, post
from litestar.params import Parameter
from litestar.response import ServerSentEvent, Stream

from cache.policy import unkeyable
from gateway.answer_rendering import ChatShape, render_answer
from gateway.cache_directives import CacheDirectives
from gateway.chat_service import ChatService
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import CLIENT_CLOSED_REQUEST
from gateway.job_translation import unknown_field
from gateway.openapi_docs import CHAT_RESPONSES, ChatAnswerOperation
from gateway.request_id import request_id
from gateway.runtime import Runtime
from gateway.schemas import ChatCompletion, ChatCompletionRequest
from gateway.strict_json import StrictJSON
from gateway.upstream.balancer import SESSION_HEADER


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
    operation_class=ChatAnswerOperation,
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
) -> Response[ChatCompletion] | ServerSentEvent | Response[bytes] | Stream | Response[None]:
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
            if (bypass := unkeyable(body, unknown_field(body))) is not None:
                answered = runtime.passthrough.answer(
                    data, body, bypass.reason, tenant, rid, session=session
                )
                return await watch.run(answered)
        answer = await watch.run(chat.answer(data, tenant, directives, rid, session))
        upstream_header = runtime.settings.upstream_header
        return await render_answer(answer, ChatShape(), data, watch, upstream_header)
    except ClientDisconnected:
        return Response(None, status_code=CLIENT_CLOSED_REQUEST)
    finally:
        watch.close()

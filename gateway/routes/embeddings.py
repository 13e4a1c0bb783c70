"""POST /v1/embeddings (on the /v1 router, gateway/app.py): the bundled embedder's
model here, any other forwarded to the upstreams that serve it."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Stream

from gateway.embeddings import EmbeddingList, EmbeddingRequest, EmbeddingService
from gateway.openapi_docs import error_responses
from gateway.request_id import request_id
from gateway.runtime import Runtime
from gateway.strict_json import StrictJSON

BYPASS_REASON = "embeddings"  # X-Cache-Bypass-Reason of a forwarded one
PATH = "/v1/embeddings"


@post(
    "/embeddings",
    status_code=200,
    summary="Create embeddings (OpenAI-compatible), from the cache's bundled embedder",
    description="Other models are forwarded to the upstreams that serve them.",
    tags=["embeddings"],
    dto=StrictJSON[EmbeddingRequest],
    return_dto=None,
    responses={
        200: ResponseSpec(EmbeddingList, description="The vectors", generate_examples=False),
        **error_responses(400, 401, 404, 413, 415, 429, 502, 503, 504),
    },
)
async def create_embeddings(
    data: EmbeddingRequest, request: Request, embeddings: EmbeddingService, runtime: Runtime
) -> EmbeddingList | Response[bytes] | Stream:
    passthrough = runtime.passthrough
    # serves() is a 404 (or 503) for a model nobody serves, here or upstream.
    if passthrough and not embeddings.serves(data.model) and passthrough.serves(data.model):
        body = msgspec.json.decode(await request.body())
        tenant: str = request.state.tenant  # set by api_key_guard (the /v1 router's)
        return await passthrough.answer(
            data, body, BYPASS_REASON, tenant, request_id(request.scope), PATH
        )
    return await embeddings.create(data)

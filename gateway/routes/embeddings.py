"""POST /v1/embeddings (on the /v1 router, gateway/app.py)."""

from __future__ import annotations

from litestar import post

from gateway.embeddings import EmbeddingList, EmbeddingRequest, EmbeddingService
from gateway.openapi_docs import error_responses
from gateway.strict_json import StrictJSON


@post(
    "/embeddings",
    status_code=200,
    summary="Create embeddings (OpenAI-compatible), from the cache's bundled embedder",
    tags=["embeddings"],
    dto=StrictJSON[EmbeddingRequest],
    return_dto=None,
    responses=error_responses(400, 401, 404, 413, 422, 429),
)
async def create_embeddings(data: EmbeddingRequest, embeddings: EmbeddingService) -> EmbeddingList:
    return await embeddings.create(data)

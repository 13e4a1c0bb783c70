"""GET /v1/models and /v1/models/{id} (on the /v1 router, gateway/app.py): every model
served, in-process or by upstreams, and every alias of one, each with its owner."""

from __future__ import annotations

from litestar import get

from gateway.openapi_docs import error_responses
from gateway.schemas import ModelCard, ModelList
from gateway.upstream import ModelRouter


@get(
    "/models",
    summary="List the served models",
    tags=["models"],
    responses=error_responses(401, 429),
)
async def list_models(upstream: ModelRouter, started: int) -> ModelList:
    return ModelList([ModelCard(m, started, upstream.owner(m)) for m in upstream.models()])


@get(
    "/models/{model_id:path}",
    summary="One served model",
    tags=["models"],
    responses=error_responses(400, 401, 404, 429, 503),
)
async def get_model(model_id: str, upstream: ModelRouter, started: int) -> ModelCard:
    model_id = model_id.lstrip("/")
    # owner() refuses a model nobody serves: 404 (503 while upstreams still list theirs).
    return ModelCard(model_id, started, upstream.owner(model_id))

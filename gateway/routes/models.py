"""GET /v1/models and /v1/models/{id} (on the /v1 router, gateway/app.py)."""

from __future__ import annotations

from litestar import get

from gateway.errors import APIError
from gateway.openapi_docs import error_responses
from gateway.schemas import ModelCard, ModelList
from gateway.upstream import Upstream


@get(
    "/models",
    summary="List the served models",
    tags=["models"],
    responses=error_responses(401, 429),
)
async def list_models(upstream: Upstream, started: int) -> ModelList:
    return ModelList([ModelCard(m, started) for m in upstream.models()])


@get(
    "/models/{model_id:path}",
    summary="One served model",
    tags=["models"],
    responses=error_responses(400, 401, 404, 429),
)
async def get_model(model_id: str, upstream: Upstream, started: int) -> ModelCard:
    model_id = model_id.lstrip("/")
    if model_id not in upstream.models():
        raise APIError(
            404, f"The model {model_id!r} does not exist", param="model", code="model_not_found"
        )
    return ModelCard(model_id, started)

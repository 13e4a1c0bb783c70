"""GET /v1/models and /v1/models/{id} (on the /v1 router, gateway/app.py): every model
served, in-process or by upstreams, and every alias of one, each with its owner, then
the bundled embedder that /v1/embeddings serves."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from litestar import Request, get

from gateway.embeddings import BUNDLED_NAME, EmbeddingService
from gateway.openapi_docs import error_responses
from gateway.runtime import Runtime
from gateway.schemas import ModelCard, ModelList
from gateway.upstream import ModelRouter
from gateway.upstream.model_router import LOCAL_OWNER


@get(
    "/models",
    summary="List the served models (chat first, the first the default), then the embedder",
    tags=["models"],
    responses=error_responses(401, 429),
)
async def list_models(upstream: ModelRouter, runtime: Runtime, started: int) -> ModelList:
    cards = [_card(m, upstream, runtime, started) for m in upstream.models()]
    if BUNDLED_NAME not in upstream.models():
        cards.append(ModelCard(BUNDLED_NAME, started, LOCAL_OWNER))
    return ModelList(cards)


@get(
    "/models/{model_id:path}",
    summary="One served model",
    tags=["models"],
    responses=error_responses(400, 401, 404, 429, 503),
)
async def get_model(
    model_id: str,
    request: Request,
    upstream: ModelRouter,
    runtime: Runtime,
    embeddings: EmbeddingService,
    started: int,
) -> ModelCard:
    model_id = _model_id(request, model_id)
    if embeddings.serves(model_id) and model_id not in upstream.models():
        return ModelCard(model_id, started, LOCAL_OWNER)
    # owner() refuses a model nobody serves: 404 (503 while upstreams still list theirs).
    return _card(model_id, upstream, runtime, started)


def _model_id(request: Request, parsed: str) -> str:
    """The id as the client sent it. Litestar's path parameter has its slashes collapsed
    (llama-server's id, its GGUF file's absolute path, came as `/v1/models//m/x.gguf`
    and was `/m/x.gguf` or, stripped, `m/x.gguf`), so it is read from the raw path."""
    raw: bytes | None = request.scope.get("raw_path")
    _, found, model_id = (raw or b"").partition(b"/v1/models/")
    if not found:
        return parsed.removeprefix("/")
    return unquote_to_bytes(model_id).decode("utf-8", "replace")


def _card(model: str, upstream: ModelRouter, runtime: Runtime, started: int) -> ModelCard:
    return ModelCard(
        model, started, upstream.owner(model), max_model_len=runtime.context_length(model)
    )

"""The app factory: `create_app(settings) -> Litestar`. Resources live in a `Runtime`
started by the lifespan and injected into handlers with `Provide`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from gateway.auth import api_key_guard
from gateway.errors import EXCEPTION_HANDLERS
from gateway.metrics import count_response
from gateway.openapi_docs import struct_schemas, swagger_assets, swagger_ui
from gateway.rate_limits import rate_limit_middleware
from gateway.request_id import add_request_id
from gateway.routes.admin import admin_router
from gateway.routes.chat import chat_completions
from gateway.routes.embeddings import create_embeddings
from gateway.routes.health import health, metrics, ready
from gateway.routes.models import get_model, list_models
from gateway.routes.text_completions import text_completions
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.upstream import Upstream

VERSION = "0.1.0"


def create_app(settings: Settings | None = None, upstream: Upstream | None = None) -> Litestar:
    settings = settings or Settings.load()
    runtime = Runtime(settings, upstream)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.close()

    # The OpenAI API: every route needs an API key (or none, on the open gateway).
    v1 = Router(
        path="/v1",
        guards=[api_key_guard],
        security=[{"ApiKey": []}],
        route_handlers=[
            chat_completions,
            create_embeddings,
            text_completions,
            list_models,
            get_model,
        ],
    )
    app = Litestar(
        route_handlers=[v1, admin_router, health, ready, metrics, swagger_assets()],
        lifespan=[lifespan],
        state=State({"runtime": runtime}),
        dependencies={
            "runtime": Provide(lambda: runtime, sync_to_thread=False),
            "chat": Provide(lambda: runtime.chat, sync_to_thread=False),
            "upstream": Provide(lambda: runtime.upstream, sync_to_thread=False),
            "embeddings": Provide(lambda: runtime.embeddings, sync_to_thread=False),
            "started": Provide(lambda: runtime.started, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=rate_limit_middleware(settings),
        before_send=[add_request_id, count_response],
        logging_config=None,  # `semgate serve` sets up logging once (gateway/serve_logging.py)
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="semgate",
            version=VERSION,
            description="OpenAI-compatible chat gateway with a Redis semantic cache.",
            path="/schema",
            render_plugins=[swagger_ui()],
            components=Components(
                security_schemes={
                    "ApiKey": SecurityScheme(type="http", scheme="bearer"),
                    "AdminKey": SecurityScheme(type="http", scheme="bearer"),
                }
            ),
        ),
    )  # fmt: skip
    struct_schemas(app.openapi_schema)
    return app

"""What the OpenAPI document says, so that it says what the server takes and sends: each
body's schema as msgspec writes it from the very Struct that decodes or encodes it
(`struct_schemas`), OpenAI's error object for every error status (never Litestar's
default `{status_code, detail, extra}`, which no client of this server receives), the
chat and text answers as JSON or as SSE streams whose events are described one by one,
and their headers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import msgspec
from litestar import Router
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import (
    OpenAPI,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    Operation,
    Reference,
    Schema,
)
from litestar.openapi.spec.enums import OpenAPIType
from litestar.static_files import create_static_files_router
from swagger_ui_bundle import swagger_ui_path

from gateway.schemas import ChatCompletion, ChatCompletionChunk, ErrorResponse, TextCompletion

ERRORS = {
    400: "Bad values, wrong types or missing fields (named in `param`, with OpenAI's "
    "`code`: `invalid_type`, `missing_required_parameter`, `unknown_parameter`, "
    "`invalid_value`), malformed or non-UTF-8 JSON; for a request the schema admits, a "
    "prompt over the context length (`context_length_exceeded`) or a value this model "
    "cannot honour (`unsupported_value`, naming it in `param`)",
    401: "No API key, or an unknown one",
    403: "A key that may not use this endpoint",
    404: "Unknown model (`model_not_found`) or entry",
    413: "Body over the size limit",
    415: "A body not sent as JSON (its Content-Type is not application/json)",
    429: "Rate limit, or the engine's queue is full (with Retry-After)",
    502: "An upstream failed, or dropped the request (`upstream_error`)",
    503: "Not ready (the model loading, Redis down for the admin API), with Retry-After",
    504: "An upstream timed out (`upstream_error`)",
}


def _structs(cls: type[msgspec.Struct] = msgspec.Struct) -> Iterator[type[msgspec.Struct]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _structs(sub)


def struct_schemas(openapi: OpenAPI) -> None:
    """Replaces each schema Litestar wrote for one of the gateway's Structs by msgspec's:
    the one its decoder checks. Litestar's loses bounds of 0 (it tests their truth, so
    `top_p > 0` and `temperature >= 0` went missing) and says nothing of
    `forbid_unknown_fields` (msgspec writes `additionalProperties: false`). A Struct's
    `schema_rules` (what a field's type cannot say, checked in code beside it) are added."""
    components = openapi.components.schemas
    # The chunks only streams send, which only their events' schemas name.
    documented = {*components, ChatCompletionChunk.__name__, TextCompletion.__name__}
    structs = {
        cls.__name__: cls
        for cls in _structs()
        if cls.__module__.startswith("gateway.") and cls.__name__ in documented
    }
    _, schemas = msgspec.json.schema_components(
        structs.values(), ref_template="#/components/schemas/{name}"
    )
    for name, schema in schemas.items():
        rules = getattr(structs.get(name), "schema_rules", {})
        # The ignore: a plain dict where Litestar types a Schema; it is written out as is.
        components[name] = {**schema, **rules}  # type: ignore[assignment]


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAI's error object at each status (all of ERRORS by default)."""
    return {
        status: ResponseSpec(ErrorResponse, description=ERRORS[status], generate_examples=False)
        for status in statuses or ERRORS
    }


def answer_responses(answer: type[msgspec.Struct]) -> dict[int, ResponseSpec]:
    """An answer's: `answer` as JSON (with `stream: true`, SSE chunks: AnswerOperation),
    and every error."""
    return {
        200: ResponseSpec(
            answer,
            description="The answer; with `stream: true`, SSE chunks instead (text/event-stream)",
            generate_examples=False,
        ),
        **error_responses(),
    }


CHAT_RESPONSES = answer_responses(ChatCompletion)

# Sent with chat answers; the OpenAPI document lists them on its 200.
ANSWER_HEADERS = {
    "X-Cache-Status": "Hit, Miss (the cache was asked) or Bypass (it was not)",
    "X-Cache-Bypass-Reason": "With upstreams, why the request was passed through as it came "
    "(tools, tool_choice, tool_messages, response_format, logprobs, n, presence_penalty, "
    "frequency_penalty, logit_bias, top_k, min_p, repetition_penalty, non_text_content, "
    "unknown_field)",
    "X-Cache-Similarity": "On a hit: the cached question's similarity (1.0 for the exact tier)",
    "X-Cache-Entry": "On a hit: the entry's id",
    "Age": "On a hit: seconds since the answer was stored",
    "X-Cache-Saved-Seconds": "On a hit: seconds the answer took to generate when it was "
    "stored (absent for seeded entries and those stored before times were kept)",
    "X-Cache-Coalesced": "true when this miss followed an equivalent request in flight",
    "x-request-id": "The client's own request id (if sane), else a fresh one",
    "Server-Timing": "Where the time went, in milliseconds (`cache;dur=3.1, embed;dur=1.2, "
    "queue;dur=12.0, prefill;dur=184.2, decode;dur=2210.5`): the cache lookup and its "
    "embedding, and the engine's phases; a stream's has what is known as it starts (its "
    "last chunk has them all, as `timings`)",
}


def _ref(struct: type[msgspec.Struct]) -> Reference:
    return Reference(f"#/components/schemas/{struct.__name__}")


def stream_event(chunk: type[msgspec.Struct], description: str) -> Schema:
    """One event of an answer's SSE stream, as OpenAPI 3.1 reads `schema` under
    text/event-stream (and schemathesis checks each event against it): its `data` is
    `[DONE]`, or JSON: a `chunk`, or the error that ends a stream that failed."""
    chunk_or_error = Schema(any_of=[_ref(chunk), _ref(ErrorResponse)])
    as_json = Schema(content_media_type="application/json", content_schema=chunk_or_error)
    data = Schema(type=OpenAPIType.STRING, schema_if=Schema(const="[DONE]"), schema_else=as_json)
    return Schema(
        type=OpenAPIType.OBJECT,
        required=["data"],
        properties={"data": data},
        description=description,
    )


@dataclass
class AnswerOperation(Operation):
    """A completion's operation, whose 200 is JSON or, with `stream: true`, an SSE stream
    of `chunk`s (ChatAnswerOperation, TextAnswerOperation)."""

    chunk: ClassVar[type[msgspec.Struct]]
    events: ClassVar[str]  # what the stream sends, in order

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            string = Schema(type=OpenAPIType.STRING)
            ok.headers = {
                name: OpenAPIHeader(schema=string, description=text)
                for name, text in ANSWER_HEADERS.items()
            }
            ok.content = dict(ok.content or {})
            ok.content["text/event-stream"] = OpenAPIMediaType(
                schema=stream_event(self.chunk, self.events + _STREAM_END)
            )


# How both kinds of stream end.
_STREAM_END = (
    ", then `data: [DONE]`; the last chunk before [DONE] has `timings`, Server-Timing's "
    'durations as an object (`{"cache": 3.1, "queue": 12.0, ...}`, milliseconds); a '
    "failure after the first chunk is one `data: {error}` event before [DONE]"
)


class ChatAnswerOperation(AnswerOperation):
    chunk = ChatCompletionChunk
    events = (
        "`data: {chunk}` events, each a `chat.completion.chunk`: the assistant's role "
        "first, content deltas, one with finish_reason, the usage (no choices) when "
        "stream_options.include_usage"
    )


class TextAnswerOperation(AnswerOperation):
    chunk = TextCompletion
    events = (
        "`data: {chunk}` events, each a `text_completion` whose choice has the next piece "
        "of `text`: the prompt first when `echo`, the generated text, one with "
        "finish_reason, the usage (no choices) when stream_options.include_usage"
    )


# The docs page (/schema and /schema/swagger) loads Swagger UI from this server, not from
# a CDN, so it renders where the gateway has no internet.
SWAGGER_ASSETS = "/schema/assets"


def swagger_ui() -> SwaggerRenderPlugin:
    return SwaggerRenderPlugin(
        js_url=f"{SWAGGER_ASSETS}/swagger-ui-bundle.js",
        css_url=f"{SWAGGER_ASSETS}/swagger-ui.css",
        standalone_preset_js_url=f"{SWAGGER_ASSETS}/swagger-ui-standalone-preset.js",
        path=["/", "/swagger"],
        favicon="",  # Litestar's default is an image on a CDN
    )


def swagger_assets() -> Router:
    return create_static_files_router(SWAGGER_ASSETS, directories=[swagger_ui_path])

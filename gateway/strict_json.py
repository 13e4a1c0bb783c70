"""Request bodies decoded strictly, and every way a body can be malformed made a 4xx.

Litestar converts bodies in msgspec's lax mode, where `"temperature": "0.5"`,
`"max_tokens": "4"` and `"stream": "true"` become numbers and booleans; the OpenAI
API (and the SDKs' types) say a wrong type is an error. `StrictJSON[Model]` as a
handler's `dto` decodes the raw body in one msgspec call, strict, straight into the
Struct (no intermediate Python objects, so JSON nested 100,000 deep never reaches the
interpreter's recursion limit), and keeps the Struct's schema in the OpenAPI document.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from litestar.dto import MsgspecDTO
from litestar.openapi.spec import Reference, Schema
from litestar.typing import FieldDefinition

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator

from gateway.errors import APIError, validation_error

T = TypeVar("T", bound=msgspec.Struct)

# msgspec's validation messages end with the JSON path: "... - at `$.messages[0].role`".
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
# A float where an integer may be: "Expected `int | null`, got `float`" (or any union
# with `int`, such as a prompt's items: "Expected `int | str | array`, got `float`").
_FLOAT_FOR_INT = re.compile(r"^Expected `(?:[^`]* \| )?int(?: \| [^`]*)?`, got `float`")

_NOT_UTF8 = "the body is not valid UTF-8"


def _integral(value: Any) -> Any:
    """`value` with its whole floats (5.0) as ints, through lists and objects."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _decode(body: bytes, model: type[T]) -> T:
    try:
        return msgspec.json.decode(body, type=model, strict=True)
    except msgspec.ValidationError as exc:
        if not _FLOAT_FOR_INT.match(str(exc)):
            raise
    # JSON has one kind of number: 5.0 for an integer field is 5, as JSON Schema (so the
    # OpenAPI document) and OpenAI's API read it. Only such bodies are decoded twice.
    return msgspec.convert(_integral(msgspec.json.decode(body)), model, strict=True)


def require_json(content_type: str) -> None:
    """415 for a body not sent as JSON (`application/json`, or a `+json` type): a text,
    a form or a body with no type is what a web page may send another site without a
    CORS preflight, and none of them is JSON to this API, whatever it holds."""
    media = content_type.partition(";")[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise APIError(
            415,
            f"the body must be sent as application/json, not {media or 'without a Content-Type'}",
            code="unsupported_media_type",
        )


def decode_strict(body: bytes, model: type[T]) -> T:
    """The body as `model`, or the OpenAI-shaped error that says what is wrong with it."""
    if not body.strip():
        raise APIError(400, "the request needs a JSON body", code="missing_body")
    try:
        return _decode(body, model)
    except msgspec.ValidationError as exc:  # valid JSON of the wrong shape, type or value
        message = str(exc)
        match = _PATH.search(message)
        # A dict's key is not named: "per_tenant[...]" is the table, "per_tenant".
        path = match.group(1).replace("[...]", "") if match else None
        raise validation_error(message, path) from None
    except msgspec.DecodeError as exc:
        # msgspec 0.23 says "Invalid UTF-8 encoded string" where 0.22 raised
        # UnicodeDecodeError: both are the same mistake, and one message.
        if "UTF-8" in str(exc):
            raise APIError(400, _NOT_UTF8, code="invalid_json") from None
        raise APIError(400, f"could not parse the JSON body: {exc}", code="invalid_json") from None
    except UnicodeDecodeError:
        raise APIError(400, _NOT_UTF8, code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the JSON body is nested too deeply", code="invalid_json") from None


class StrictJSON(MsgspecDTO[T]):
    """A handler's `dto` (with `return_dto=None`) that decodes its `data` strictly."""

    def decode_bytes(self, value: bytes) -> Any:
        require_json(self.asgi_connection.headers.get("content-type", ""))
        return decode_strict(value, self.model_type)

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: SchemaCreator
    ) -> Reference | Schema:
        # The Struct's own schema, under its own name (not a generated transfer model's).
        return schema_creator.for_field_definition(FieldDefinition.from_annotation(cls.model_type))

"""Every error leaves the gateway in the OpenAI shape:
`{"error": {"message", "type", "param", "code"}}` with the matching HTTP status."""

from __future__ import annotations

import logging
import re

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    ClientException,
    HTTPException,
    InternalServerException,
    ValidationException,
)
from litestar.types import ExceptionHandlersMap

from gateway.schemas import ErrorBody, ErrorResponse

log = logging.getLogger("semgate.gateway")

# HTTP status -> OpenAI error type, for errors raised by Litestar itself.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}
ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
# msgspec's (and so Litestar's) validation messages -> OpenAI's code for the mistake: a
# field missing, one not known, a value of the wrong type or not among a field's values.
# A value out of a field's range has none (OpenAI's differ by type and bound).
_VALIDATION_CODES = (
    (re.compile(r"^Object missing required field `([^`]+)`"), "missing_required_parameter"),
    (re.compile(r"^Object contains unknown field `([^`]+)`"), "unknown_parameter"),
    (re.compile(r"^Expected `[^`]+`, got `"), "invalid_type"),
    (re.compile(r"^Invalid enum value"), "invalid_value"),
)


def validation_error(message: str, path: str | None) -> APIError:
    """A body or parameter that does not validate, as OpenAI answers it: a 400 whose
    `param` names the field (a missing or unknown one too, which msgspec names in the
    message rather than the path) and whose `code` says what is wrong, where it can."""
    for pattern, code in _VALIDATION_CODES:
        if found := pattern.match(message):
            named = found.group(1) if found.groups() else None
            param = ".".join(p for p in (path, named) if p) or None
            return APIError(400, f"invalid request: {message}", code=code, param=param)
    return APIError(400, f"invalid request: {message}", param=path or None)


# The 400s a request the API accepts can still get, as OpenAI names them: what this model
# cannot do (a value other than the in-process engine's or the embedder's own, OpenAI's
# code for a model that refuses one), or a prompt that does not fit its context.
UNSUPPORTED = "unsupported_value"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
# nginx's status for a request whose client left first; nobody receives it, but the
# access log and middleware see why the request ended.
CLIENT_CLOSED_REQUEST = 499
# What Litestar raises when the connection closes while it reads the body: the client
# left, or its body was too slow (gateway/client_limits.py answered it 408 already).
CLIENT_LEFT = "client disconnected prematurely"


class APIError(Exception):
    """A request the gateway refuses or cannot serve, reported in the OpenAI shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorBody(self.message, self.type, self.param, self.code))

    def event(self) -> bytes:
        """The error as a JSON payload for an SSE `data:` line (mid-stream failures)."""
        return msgspec.json.encode(self.body())


def error_response(exc: APIError) -> Response[ErrorResponse]:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
    return Response(exc.body(), status_code=exc.status, headers=headers)


def handle_api_error(_: Request, exc: APIError) -> Response[ErrorResponse]:
    return error_response(exc)


def _validation_error(exc: ValidationException) -> APIError:
    """Litestar's validation (query parameters, bodies without StrictJSON): the first
    problem, as validation_error says it; a missing body is `missing_body`."""
    problems = exc.extra if isinstance(exc.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    key = str(first.get("key", ""))
    if key == "data" and first.get("message") == "'data'":
        return APIError(400, "the request needs a JSON body", code="missing_body")
    return validation_error(str(first.get("message") or exc.detail), key)


def handle_http_exception(_: Request, exc: HTTPException) -> Response[ErrorResponse]:
    status = exc.status_code
    if isinstance(exc, InternalServerException) and exc.detail == CLIENT_LEFT:
        return error_response(APIError(CLIENT_CLOSED_REQUEST, "the client closed the request"))
    if status >= 500:
        log.error("server error: %r", exc, exc_info=exc)
    if isinstance(exc, ValidationException):
        return error_response(_validation_error(exc))
    message = exc.detail
    if type(exc) is ClientException and status == 400:  # the body is not valid JSON
        message = f"could not parse the JSON body: {exc.detail}"
    elif status == 429:
        message = "rate limit exceeded; retry after Retry-After seconds"
    elif status == 413:
        message = "request body is too large"
    api_error = APIError(
        status,
        message,
        ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
        ERROR_CODES.get(status, "rate_limit_exceeded" if status == 429 else None),
    )
    response = error_response(api_error)
    headers = exc.headers or {}
    for name, value in headers.items():
        response.headers[name] = value
    if status == 429 and "RateLimit-Reset" in headers:
        # The window may reset "now" (0); clients need a positive wait to back off.
        response.headers["Retry-After"] = str(max(1, int(headers["RateLimit-Reset"])))
    return response


def handle_internal_error(_: Request, exc: Exception) -> Response[ErrorResponse]:
    log.exception("internal error", exc_info=exc)
    return error_response(APIError(500, "internal server error", "server_error"))


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    APIError: handle_api_error,
    HTTPException: handle_http_exception,
    Exception: handle_internal_error,
}

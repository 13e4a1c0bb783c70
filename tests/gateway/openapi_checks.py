"""schemathesis hooks for tests/gateway/test_openapi.py (loaded with SCHEMATHESIS_HOOKS).

`accepts_schema_valid_requests` is schemathesis' positive_data_acceptance, less the
refusals no OpenAPI document can state: a prompt plus max_tokens over the model's
context (`context_length_exceeded`), a value the model behind the server cannot honour
(`unsupported_value`: OpenAI's code for a model-dependent refusal; the same request is
passed through with upstreams), and a flush that names no entries (`missing_scope`:
OpenAPI has no "one of these query parameters"). Any other 400 to a request the
document admits is a disagreement between the two.

The fuzzer's answers are kept short (max_tokens at most 8): the engine's speed is not
what is tested, and an answer generated to the context's end takes a minute here.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

UNSTATABLE_REFUSALS = frozenset({"context_length_exceeded", "unsupported_value", "missing_scope"})
MAX_TOKENS = 8
_COMPLETIONS = ("/v1/chat/completions", "/v1/completions")


def _code(response: Any) -> object:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


@schemathesis.check
def accepts_schema_valid_requests(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code == 400 and _code(response) in UNSTATABLE_REFUSALS:
        return None
    return positive_data_acceptance(ctx, response, case)


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    if ctx.operation.path in _COMPLETIONS and isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(field), int | float) and body[field] >= 1:
                body[field] = min(body[field], MAX_TOKENS)
        if not isinstance(body.get("max_tokens"), int | float):
            body["max_tokens"] = MAX_TOKENS
    return body

"""Requests the cache cannot key safely: their answer depends on more than the question
the cache matches (tools, a schema, sampling it does not key on, fields it does not
know), or is not one text (tool calls, logprobs, several choices). With upstreams they
are passed through untouched (gateway/passthrough.py) and counted by reason; the
in-process engine refuses them with a 400 naming the field, as it cannot honour them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.schemas import ChatCompletionRequest, ChatMessage, ContentPart

log = logging.getLogger("semgate.gateway")

# Fields of the request, of a message and of a content part that the gateway knows.
_MESSAGE_FIELDS = frozenset(ChatMessage.__struct_fields__)
_PART_FIELDS = frozenset(ContentPart.__struct_fields__)
_REQUEST_FIELDS = frozenset(ChatCompletionRequest.__struct_fields__)


@dataclass(frozen=True)
class Unkeyable:
    """Why a request cannot be keyed: `reason` is the X-Cache-Bypass-Reason and the
    metric label; `param` and `message` are the in-process engine's 400."""

    reason: str
    param: str
    message: str


def _tool_messages(messages: list[ChatMessage]) -> bool:
    return any(m.role in ("tool", "function") or m.tool_calls or m.function_call for m in messages)


def _non_text(messages: list[ChatMessage]) -> bool:
    return any(
        part.type != "text" or part.text is None
        for m in messages
        if isinstance(m.content, list)
        for part in m.content
    )


Checks = tuple[tuple[Callable[[Any], bool], Unkeyable], ...]

# Sampling fields chat and text completions share; neutral values (n 1, penalties 0,
# top_k -1 or 0, min_p 0, repetition_penalty 1) change nothing and are keyed as usual.
SAMPLING_CHECKS: Checks = (
    (lambda r: r.n not in (None, 1), Unkeyable("n", "n", "only n=1 is supported")),
    (
        lambda r: bool(r.presence_penalty),
        Unkeyable("presence_penalty", "presence_penalty", "presence_penalty is not supported"),
    ),
    (
        lambda r: bool(r.frequency_penalty),
        Unkeyable("frequency_penalty", "frequency_penalty", "frequency_penalty is not supported"),
    ),
    (
        lambda r: bool(r.logit_bias),
        Unkeyable("logit_bias", "logit_bias", "logit_bias is not supported"),
    ),
    (lambda r: r.top_k not in (None, -1, 0), Unkeyable("top_k", "top_k", "top_k is not supported")),
    (lambda r: bool(r.min_p), Unkeyable("min_p", "min_p", "min_p is not supported")),
    (
        lambda r: r.repetition_penalty not in (None, 1),
        Unkeyable(
            "repetition_penalty", "repetition_penalty", "repetition_penalty is not supported"
        ),
    ),
)

# In order: the first that applies is the reason.
_CHECKS: Checks = (
    (lambda r: bool(r.tools), Unkeyable("tools", "tools", "tools are not supported")),
    (
        lambda r: r.tool_choice not in (None, "none"),
        Unkeyable("tool_choice", "tool_choice", "tool_choice is not supported"),
    ),
    (
        lambda r: _tool_messages(r.messages),
        Unkeyable("tool_messages", "messages", "tool and function messages are not supported"),
    ),
    (
        lambda r: bool(r.response_format) and r.response_format.get("type", "text") != "text",
        Unkeyable(
            "response_format", "response_format", "only response_format type 'text' is supported"
        ),
    ),
    (
        lambda r: bool(r.logprobs or r.top_logprobs),
        Unkeyable("logprobs", "logprobs", "logprobs are not supported"),
    ),
    *SAMPLING_CHECKS,
    (
        lambda r: _non_text(r.messages),
        Unkeyable("non_text_content", "messages", "only text content parts are supported"),
    ),
)


def first_applying(checks: Checks, request: Any) -> Unkeyable | None:
    """The first of `checks` that applies to `request`, if any."""
    return next((found for check, found in checks if check(request)), None)


def unkeyable(request: ChatCompletionRequest) -> Unkeyable | None:
    """The first of the request's known fields that the cache cannot key, if any."""
    return first_applying(_CHECKS, request)


def unknown_field(body: Mapping[str, Any]) -> str | None:
    """The first field of the raw body (top level, a message, a content part) that the
    gateway does not know, as a path (`reasoning_effort`, `messages[1].tool_calls`); null
    values count as absent, as SDKs send unset fields as null."""
    for name, value in body.items():
        if name not in _REQUEST_FIELDS and value is not None:
            return name
    for i, message in enumerate(body.get("messages") or []):
        for name, value in message.items():
            if name not in _MESSAGE_FIELDS and value is not None:
                return f"messages[{i}].{name}"
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            for name, value in part.items():
                if name not in _PART_FIELDS and value is not None:
                    return f"messages[{i}].content[{j}].{name}"
    return None


def bypass_reason(request: ChatCompletionRequest, body: Mapping[str, Any]) -> str | None:
    """Why the cache must let this request through untouched (None: it may key it).
    `body` is the request as received (already validated as `request`)."""
    if (found := unkeyable(request)) is not None:
        return found.reason
    if (path := unknown_field(body)) is None:
        return None
    log.debug("passed through for its field %s, unknown to the gateway", path)
    return "unknown_field"

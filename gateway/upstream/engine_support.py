"""What the in-process engine can honour of a request: anything it cannot is refused with
a 400 naming the field, never silently ignored (gateway/upstream/in_process.py's
`supports`). Its sampler takes temperature, top_p, top_k, seed, stop and max_tokens;
it answers with one text (no tools, logprobs or several choices) from text messages.
Neutral values ask for nothing (cache/policy.py's `sets`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cache.policy import non_text_content, sets, tool_messages
from gateway.upstream.base import CompletionJob, Unsupported

Rule = tuple[Callable[[Mapping[str, Any]], bool], Unsupported]


def _field(name: str, message: str) -> Rule:
    return (lambda fields: sets(fields, name)), Unsupported(name, message)


# Sampling fields chat and text completions share.
_SAMPLING: tuple[Rule, ...] = (
    _field("n", "only n=1 is supported"),
    _field("presence_penalty", "presence_penalty is not supported"),
    _field("frequency_penalty", "frequency_penalty is not supported"),
    _field("logit_bias", "logit_bias is not supported"),
    _field("min_p", "min_p is not supported"),
    _field("repetition_penalty", "repetition_penalty is not supported"),
)

# In order: the first that applies is the one refused.
_CHAT: tuple[Rule, ...] = (
    _field("tools", "tools are not supported"),
    _field("tool_choice", "tool_choice is not supported"),
    (tool_messages, Unsupported("messages", "tool and function messages are not supported")),
    _field("response_format", "only response_format type 'text' is supported"),
    (
        lambda f: sets(f, "logprobs") or sets(f, "top_logprobs"),
        Unsupported("logprobs", "logprobs are not supported"),
    ),
    *_SAMPLING,
    (non_text_content, Unsupported("messages", "only text content parts are supported")),
)

# A text completion's `logprobs` is a count: any, 0 included, asks for them.
_TEXT: tuple[Rule, ...] = (
    _field("best_of", "only best_of=1 is supported"),
    (
        lambda f: f.get("logprobs") is not None,
        Unsupported("logprobs", "logprobs are not supported"),
    ),
    _field("suffix", "suffix is not supported"),
    *_SAMPLING,
)


def unsupported(job: CompletionJob) -> Unsupported | None:
    """The first of the job's fields the engine cannot honour, if any."""
    rules = _CHAT if job.prompt is None else _TEXT
    found = next((found for applies, found in rules if applies(job.fields)), None)
    if found is None:
        return None
    return Unsupported(found.param, f"{found.message} by the in-process engine")

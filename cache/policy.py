"""What may be served from the cache or stored into it, and why not; and the scope a
request belongs to. The one place that decides whether a request can be cached.

The cache answers one question: "this user message, in this context". The
context fingerprint hashes the model, the system prompt and every earlier turn,
so a follow-up ("and in winter?") only ever matches inside the same conversation.

A request the cache cannot key is one whose answer depends on more than the question it
matches (tools, a schema, sampling it does not key on, fields it does not know), or is
not one text (tool calls, logprobs, several choices): `CachePolicy.unkeyable` names the
first such field. With upstreams such a request is passed through as it came; the
in-process engine runs it uncached when it can (gateway/upstream: `supports`).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = Mapping[str, str]


@dataclass(frozen=True)
class CacheScope:
    """Entries are only ever matched inside one scope (plus the embedder, added by the store)."""

    tenant: str
    model: str
    context: str


@dataclass(frozen=True)
class CacheRequest:
    """A chat request as the cache sees it. `messages` are the conversation's text (what
    is keyed); `fields` are the request's fields as the client set them, by OpenAI's names
    and as plain values (what the policy's rules read: tools, n, penalties, the messages'
    tool calls and content parts, ...)."""

    model: str
    messages: Sequence[Message]
    tenant: str = "default"
    temperature: float = 1.0
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionOutcome:
    """How an upstream answer ended."""

    text: str
    finish_reason: str | None


@dataclass(frozen=True)
class Bypass:
    """Why the cache lets a request through: `reason` is X-Cache-Bypass-Reason and the
    metric label, `detail` what an operator reads."""

    reason: str
    detail: str


# Values of a request's fields that change nothing, beside None (not sent) and, for the
# fields not listed, any falsy value (0, false, empty): n and best_of 1, top_k -1 or 0
# (off), repetition_penalty 1, tool_choice "none", response_format of type "text".
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "top_k": (-1, 0),
    "repetition_penalty": (1,),
    "tool_choice": ("none",),
}


def sets(fields: Mapping[str, Any], name: str) -> bool:
    """Whether a request (its `fields`, as CacheRequest.fields) gives field `name` a value
    that asks for something (not None nor a neutral value)."""
    value: Any = fields.get(name)
    if name == "response_format":
        return bool(value) and value.get("type", "text") != "text"
    if name in _NEUTRAL:
        return value not in (None, *_NEUTRAL[name])
    return bool(value)


def tool_messages(fields: Mapping[str, Any]) -> bool:
    """Whether any message is a tool's or a function's result, or an assistant's call."""
    return any(
        m.get("role") in ("tool", "function") or m.get("tool_calls") or m.get("function_call")
        for m in fields.get("messages", ())
    )


def non_text_content(fields: Mapping[str, Any]) -> bool:
    """Whether any message has a content part other than text (image, audio, file)."""
    return any(
        part.get("type") != "text" or part.get("text") is None
        for m in fields.get("messages", ())
        if isinstance(m.get("content"), list)
        for part in m["content"]
    )


def _field(name: str, detail: str) -> tuple[Callable[[Mapping[str, Any]], bool], Bypass]:
    return (lambda fields: sets(fields, name)), Bypass(name, detail)


# In order: the first that applies is the reason.
_UNKEYABLE: tuple[tuple[Callable[[Mapping[str, Any]], bool], Bypass], ...] = (
    _field("tools", "requests with tools are not cached"),
    _field("tool_choice", "tool_choice is not cached"),
    (tool_messages, Bypass("tool_messages", "tool and function messages are not cached")),
    _field("response_format", "response formats are not cached"),
    (
        lambda f: sets(f, "logprobs") or sets(f, "top_logprobs"),
        Bypass("logprobs", "logprobs are not cached"),
    ),
    _field("n", "n > 1 asks for several different answers"),
    _field("presence_penalty", "presence_penalty is not keyed"),
    _field("frequency_penalty", "frequency_penalty is not keyed"),
    _field("logit_bias", "logit_bias is not keyed"),
    _field("top_k", "top_k is not keyed"),
    _field("min_p", "min_p is not keyed"),
    _field("repetition_penalty", "repetition_penalty is not keyed"),
    (non_text_content, Bypass("non_text_content", "only text content is cached")),
)


def normalize_prompt(text: str) -> str:
    """The exact tier's key text: Unicode-normalised, case-folded, whitespace collapsed,
    trailing punctuation dropped, so "What is X?" and "what is x" share one entry."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(text.split()).rstrip(" ?!.")


def context_fingerprint(model: str, earlier: Sequence[Message]) -> str:
    """Hash of the model and every message before the question (system prompt included)."""
    payload = json.dumps(
        [model, [[m.get("role", ""), m.get("content", "")] for m in earlier]],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


@dataclass
class CachePolicy:
    """Rules for serving and storing. `max_temperature`: requests sampling hotter than this
    want variety, so they bypass the cache (0 caches greedy requests only)."""

    max_temperature: float = 1.0
    cacheable_finish_reasons: frozenset[str] = field(default_factory=lambda: frozenset({"stop"}))

    def question(self, request: CacheRequest) -> str | None:
        """The text that is embedded and matched: the final user message."""
        if not request.messages:
            return None
        last = request.messages[-1]
        content = last.get("content")
        if last.get("role") != "user" or not isinstance(content, str) or not content.strip():
            return None
        return content

    def scope(self, request: CacheRequest) -> CacheScope:
        return CacheScope(
            tenant=request.tenant,
            model=request.model,
            context=context_fingerprint(request.model, request.messages[:-1]),
        )

    def unkeyable(
        self, fields: Mapping[str, Any], unknown_field: str | None = None
    ) -> Bypass | None:
        """The first of a request's `fields` (as CacheRequest.fields) the cache cannot key,
        if any; else `unknown_field`, a field the gateway does not know (a path such as
        `messages[1].prefix`), where the caller read the body as received."""
        found = next((bypass for applies, bypass in _UNKEYABLE if applies(fields)), None)
        if found is None and unknown_field is not None:
            return Bypass("unknown_field", f"the field {unknown_field} is not known")
        return found

    def may_lookup(self, request: CacheRequest) -> Bypass | None:
        """Why the cache must not answer this request (None: it may)."""
        if (found := self.unkeyable(request.fields)) is not None:
            return found
        if request.temperature > self.max_temperature:
            return Bypass(
                "temperature",
                f"temperature {request.temperature} is above the cache's maximum "
                f"{self.max_temperature}",
            )
        if self.question(request) is None:
            return Bypass("not_a_question", "the last message is not a user question")
        return None

    def may_store(self, request: CacheRequest, outcome: CompletionOutcome) -> Bypass | None:
        """Why this answer must not be stored (None: it may)."""
        if (found := self.may_lookup(request)) is not None:
            return found
        if outcome.finish_reason not in self.cacheable_finish_reasons:
            return Bypass("finish_reason", f"finish_reason {outcome.finish_reason!r} is not cached")
        if not outcome.text.strip():
            return Bypass("empty", "empty answers are not cached")
        return None

"""What may be served from the cache or stored into it, and why not; and the scope a
request belongs to. The one place that decides whether a request can be cached.

The cache answers one question: "this user message, in this context". The
context fingerprint hashes the model, the system prompt and every earlier turn,
so a follow-up ("and in winter?") only ever matches inside the same conversation.

A request the cache cannot key is one whose answer depends on more than the question it
matches (tools, a schema, sampling it does not key on, fields it does not know), or is
not one text (tool calls, logprobs, several choices): `unkeyable` names the
first such field, from CHAT_ASKS. With upstreams such a request is passed through as it
came; the in-process engine runs it uncached when it honours what it asks (gateway/
upstream/engine_support.py), and refuses it with a 400 otherwise.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
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

    @cached_property
    def unkeyable(self) -> Bypass | None:
        """What in its fields the cache cannot key (the module's `unkeyable`). Read
        once: it walks every message, and the lookup and the store both ask (the chat
        service asks first, off the event loop for a long conversation)."""
        return unkeyable(self.fields)


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


def given(name: str, *neutral: object) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a request's `fields` give field `name` a value that asks for something:
    not None (not sent) nor one of its `neutral` values, or, with none named, not falsy
    (0, false, empty)."""
    if neutral:
        return lambda fields: fields.get(name) not in (None, *neutral)
    return lambda fields: bool(fields.get(name))


def _tool_messages(fields: Mapping[str, Any]) -> bool:
    """Whether any message is a tool's or a function's result, or an assistant's call."""
    return any(
        m.get("role") in ("tool", "function") or m.get("tool_calls") or m.get("function_call")
        for m in fields.get("messages", ())
    )


def _response_format(fields: Mapping[str, Any]) -> bool:
    """Whether it asks for a format other than text (a JSON object or schema)."""
    value: dict[str, Any] = fields.get("response_format") or {}
    return value.get("type", "text") != "text"


def _non_text_content(fields: Mapping[str, Any]) -> bool:
    """Whether any message has a content part other than text (image, audio, file)."""
    return any(
        part.get("type") != "text" or part.get("text") is None
        for m in fields.get("messages", ())
        if isinstance(m.get("content"), list)
        for part in m["content"]
    )


@dataclass(frozen=True)
class Ask:
    """Something a request asks beyond one text answer to its question: `name` is the
    X-Cache-Bypass-Reason and the metric label, `param` the request field an upstream's
    400 names, `what` the words for it; `asked` tells whether a request's fields ask it.
    The cache keys none of them; each upstream says which it honours (`supports`)."""

    name: str
    param: str
    what: str
    asked: Callable[[Mapping[str, Any]], bool]


def _field(name: str, what: str, *neutral: object) -> Ask:
    return Ask(name, name, what, given(name, *neutral))


# Sampling that chat and text completions share; neutral values change nothing (n 1,
# top_k -1 or 0, repetition_penalty 1, penalties and min_p 0).
SAMPLING_ASKS: tuple[Ask, ...] = (
    _field("n", "n > 1 (several different answers)", 1),
    _field("presence_penalty", "presence_penalty"),
    _field("frequency_penalty", "frequency_penalty"),
    _field("logit_bias", "logit_bias"),
    _field("top_k", "top_k", -1, 0),
    _field("min_p", "min_p"),
    _field("repetition_penalty", "repetition_penalty", 1),
)
# A chat request's, in order: the first asked is the reason.
CHAT_ASKS: tuple[Ask, ...] = (
    _field("tools", "tools"),
    _field("tool_choice", "tool_choice", "none"),
    Ask("tool_messages", "messages", "tool and function messages", _tool_messages),
    Ask("response_format", "response_format", "a response_format other than text",
        _response_format),
    Ask("logprobs", "logprobs", "logprobs",
        lambda f: given("logprobs")(f) or given("top_logprobs")(f)),
    *SAMPLING_ASKS,
    Ask("non_text_content", "messages", "content parts other than text", _non_text_content),
    _field("kv_transfer_params", "a prefill/decode transfer (kv_transfer_params)"),
)  # fmt: skip


def first_asked(asks: tuple[Ask, ...], fields: Mapping[str, Any]) -> Ask | None:
    """The first of `asks` that a request's `fields` ask, if any."""
    return next((ask for ask in asks if ask.asked(fields)), None)


def unkeyable(fields: Mapping[str, Any], unknown_field: str | None = None) -> Bypass | None:
    """The first of a chat request's `fields` (as CacheRequest.fields) the cache cannot
    key, if any; else `unknown_field`, a field the gateway does not know (a path such as
    `messages[1].prefix`), where the caller read the body as received."""
    if (ask := first_asked(CHAT_ASKS, fields)) is not None:
        return Bypass(ask.name, f"{ask.what}: not keyed by the cache")
    if unknown_field is not None:
        return Bypass("unknown_field", f"the field {unknown_field} is not known")
    return None


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

    def may_lookup(self, request: CacheRequest) -> Bypass | None:
        """Why the cache must not answer this request (None: it may)."""
        if (found := request.unkeyable) is not None:
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

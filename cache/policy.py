"""What may be served from the cache or stored into it, and the scope a request belongs to.

The cache answers one question: "this user message, in this context". The
context fingerprint hashes the model, the system prompt and every earlier turn,
so a follow-up ("and in winter?") only ever matches inside the same conversation.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Message = Mapping[str, str]


@dataclass(frozen=True)
class CacheScope:
    """Entries are only ever matched inside one scope (plus the embedder, added by the store)."""

    tenant: str
    model: str
    context: str


@dataclass(frozen=True)
class CacheRequest:
    """The parts of a chat request the cache cares about."""

    model: str
    messages: Sequence[Message]
    tenant: str = "default"
    temperature: float = 1.0
    n: int = 1
    logprobs: bool = False
    tools: bool = False


@dataclass(frozen=True)
class CompletionOutcome:
    """How an upstream answer ended."""

    text: str
    finish_reason: str | None
    error: bool = False
    aborted: bool = False
    tool_calls: bool = False


@dataclass(frozen=True)
class CacheDecision:
    """`reason` is None when allowed, else why the cache is bypassed (shown to operators)."""

    reason: str | None = None

    @property
    def allowed(self) -> bool:
        return self.reason is None


ALLOWED = CacheDecision()


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

    def may_lookup(self, request: CacheRequest) -> CacheDecision:
        if request.n != 1:
            return CacheDecision("n > 1 asks for several different answers")
        if request.logprobs:
            return CacheDecision("logprobs are not cached")
        if request.tools:
            return CacheDecision("requests with tools are not cached")
        if request.temperature > self.max_temperature:
            return CacheDecision(
                f"temperature {request.temperature} is above the cache's maximum "
                f"{self.max_temperature}"
            )
        if self.question(request) is None:
            return CacheDecision("the last message is not a user question")
        return ALLOWED

    def may_store(self, request: CacheRequest, outcome: CompletionOutcome) -> CacheDecision:
        decision = self.may_lookup(request)
        if not decision.allowed:
            return decision
        if outcome.error:
            return CacheDecision("errors are not cached")
        if outcome.aborted:
            return CacheDecision("aborted answers are not cached")
        if outcome.tool_calls:
            return CacheDecision("tool calls are not cached")
        if outcome.finish_reason not in self.cacheable_finish_reasons:
            return CacheDecision(f"finish_reason {outcome.finish_reason!r} is not cached")
        if not outcome.text.strip():
            return CacheDecision("empty answers are not cached")
        return ALLOWED

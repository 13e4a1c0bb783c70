"""The OpenAI Chat Completions wire types, as msgspec Structs. Unknown request fields
are ignored by decoding (msgspec's default), so newer SDKs keep working; with upstreams
a request that has any is passed through (gateway/bypass.py). Plain limits on request
values are constraints (`msgspec.Meta`) on the fields: decoding checks them (a value out
of range is a 400 naming the field, gateway/strict_json.py), and the OpenAPI document
shows them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from cache.store import MAX_TTL

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]

MAX_STOP = 4
MAX_SEED = 2**63 - 1
StopSequence = Annotated[str, Meta(min_length=1)]


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # An assistant's tool calls and a tool result's call id: read only to pass them on.
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class CacheOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The gateway's own field (LiteLLM's spelling): how long to keep this answer."""

    # Seconds, 1 to 10 years; default: the server's cache TTL.
    ttl: Annotated[int, Meta(ge=1, le=MAX_TTL)] | None = None


class ChatCompletionRequest(msgspec.Struct):
    model: str
    messages: list[ChatMessage]
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    stop: StopSequence | Annotated[list[StopSequence], Meta(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens, EOS or not
    cache_salt: str | None = None  # vLLM's extension: share prefix-cache blocks only within it
    cache: CacheOptions | None = None
    # Never silently ignored: values that ask for something (gateway/bypass.py) are
    # passed through to upstreams, and refused by the in-process engine.
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's sampling extensions (-1 and 0: top_k off).
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int  # of prompt_tokens, served from cache (docs/gateway.md)


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # As OpenAI and vLLM send it (0 included); absent where the upstream did not say.
    prompt_tokens_details: PromptTokensDetails | msgspec.UnsetType = msgspec.UNSET

    @classmethod
    def of(cls, prompt: int | None, completion: int | None, cached: int | None) -> Usage:
        """An answer's usage from its counts (None: unknown; the counts are then 0)."""
        prompt, completion = prompt or 0, completion or 0
        details = msgspec.UNSET if cached is None else PromptTokensDetails(cached)
        return cls(prompt, completion, prompt + completion, details)


class ResponseMessage(msgspec.Struct):
    role: Literal["assistant"]
    content: str


class Choice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class DeltaMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None
    # The gateway's own: on the last chunk, where the answer's time went (milliseconds
    # by Server-Timing name: cache, embed, queue, prefill, decode); absent elsewhere.
    timings: dict[str, float] | msgspec.UnsetType = msgspec.UNSET


class CompletionRequest(msgspec.Struct):
    """OpenAI's legacy text completion (POST /v1/completions): gateway/text_completions.py."""

    model: str
    # Text, the model's token ids (vLLM's reading), or a list of one of those.
    prompt: str | list[str | int | list[int]]
    max_tokens: Annotated[int, Meta(ge=1)] | None = None  # None: OpenAI's default, 16
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    stop: StopSequence | Annotated[list[StopSequence], Meta(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    user: str | None = None
    ignore_eos: bool = False
    cache_salt: str | None = None
    # Refused by the in-process engine unless neutral; upstreams get them as sent.
    n: int | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class TextCompletion(msgspec.Struct):
    """A text completion, and each of its SSE chunks (usage: on the answer, and on a
    stream's last chunk when asked; timings: as on ChatCompletionChunk)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: Usage | None = None
    timings: dict[str, float] | msgspec.UnsetType = msgspec.UNSET


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "semgate"
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"

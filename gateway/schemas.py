"""The OpenAI Chat Completions wire types, as msgspec Structs. Unknown request fields
are ignored by decoding (msgspec's default), so newer SDKs keep working; with upstreams
a request that has any is passed through (cache/policy.py: unknown_field). Limits on
request values are the fields' constrained types (gateway/request_fields.py): decoding
checks them, and the OpenAPI document shows them."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from gateway.request_fields import (
    MaxTokens,
    MinP,
    NonEmpty,
    RepetitionPenalty,
    Seed,
    Stop,
    Temperature,
    TokenId,
    TokenIds,
    TopK,
    TopP,
    Ttl,
)

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


# What gateway/chat_service.py asks of a message's content, as the OpenAPI document says
# it (gateway/openapi_docs.py adds a Struct's `schema_rules` to its schema): only an
# assistant's may be null or no parts (it called tools).
CONTENT_RULE: dict[str, Any] = {
    "if": {"properties": {"role": {"enum": ["system", "developer", "user"]}}},
    "then": {
        "required": ["content"],
        "properties": {
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1}]}
        },
    },
}


class TextPart(msgspec.Struct):
    type: Literal["text"]
    text: str


class TextMessage(msgspec.Struct):
    """A message of text only: what the cache keys (the admin API's questions and
    contexts)."""

    schema_rules: ClassVar[dict[str, Any]] = CONTENT_RULE
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatMessage(msgspec.Struct):
    schema_rules: ClassVar[dict[str, Any]] = CONTENT_RULE
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

    ttl: Ttl | None = None  # default: the server's cache TTL


Messages = Annotated[list[ChatMessage], Meta(min_length=1)]


class ChatCompletionRequest(msgspec.Struct):
    model: str
    messages: Messages
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens, EOS or not
    cache_salt: str | None = None  # vLLM's extension: share prefix-cache blocks only within it
    # vLLM's P/D protocol: {"do_remote_decode": true} asks a prefill server to save the
    # prompt's KV for a decode server; what it answers is sent on to the decode server.
    kv_transfer_params: dict[str, Any] | None = None
    cache: CacheOptions | None = None
    # Never silently ignored: values that ask for something (cache/policy.py) are
    # passed through to upstreams, and refused by the in-process engine.
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's sampling extensions.
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None


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
    # vLLM's P/D protocol: a prefill server's answer to `do_remote_decode`, for the
    # decode server; absent otherwise.
    kv_transfer_params: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


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
    """OpenAI's legacy text completion (POST /v1/completions): gateway/job_translation.py."""

    model: str
    # Text, the model's token ids (vLLM's reading), or a list of one of those (several
    # prompts: upstreams only, gateway/job_translation.py).
    prompt: NonEmpty | Annotated[list[NonEmpty | TokenId | TokenIds], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None  # None: OpenAI's default, 16
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    user: str | None = None
    ignore_eos: bool = False
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None  # as on ChatCompletionRequest
    # Refused by the in-process engine unless neutral; upstreams get them as sent.
    n: int | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None


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
    kv_transfer_params: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # as ChatCompletion's


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
    # The context length, prompt and answer together (vLLM's field), of a model this
    # gateway runs; null for a remote server's (its own /v1/models says it).
    max_model_len: int | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"

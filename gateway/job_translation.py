"""OpenAI requests as the gateway's parts take them: a chat or text completion request
becomes the `CompletionJob` an upstream runs, and a chat request the `CacheRequest` the
cache's policy judges and keys. Ranges and lengths (temperature, top_p, max_tokens,
stop, seed) were checked as the body was decoded: they are constraints on the request
Structs' fields (gateway/request_fields.py)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import msgspec

from cache import CacheRequest
from gateway.auth import OPEN_TENANT
from gateway.errors import UNSUPPORTED, APIError
from gateway.off_loop import INLINE_CHARS, MESSAGE_CHARS
from gateway.request_fields import sampling_given
from gateway.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
    TextMessage,
)
from gateway.upstream import CompletionJob, Upstream

DEFAULT_TEXT_MAX_TOKENS = 16  # a text completion's, as OpenAI's and vLLM's

# Fields of the request, of a message and of a content part that the gateway knows.
_MESSAGE_FIELDS = frozenset(ChatMessage.__struct_fields__)
_PART_FIELDS = frozenset(ContentPart.__struct_fields__)
_REQUEST_FIELDS = frozenset(ChatCompletionRequest.__struct_fields__)


def _text(message: ChatMessage | TextMessage) -> str:
    """The message's text parts, joined. Only a system, developer or user message must
    have content (gateway/schemas.py's CONTENT_RULE); an assistant's that called tools,
    and tool results, need none. Other parts are left out: whoever cannot take them says
    so (Upstream.supports; upstreams get such requests as they came)."""
    content = message.content
    if content is None or content == []:
        if message.role not in ("system", "developer", "user"):
            return ""
        raise APIError(
            400,
            f"a {message.role} message needs content: a string or at least one part",
            param="messages",
        )
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content if part.type == "text" and part.text is not None)


def flatten_messages(messages: Sequence[ChatMessage | TextMessage]) -> list[dict[str, str]]:
    """OpenAI messages -> the engine's {"role", "content"} strings (developer -> system)."""
    if not messages:
        raise APIError(400, "messages must not be empty", param="messages")
    return [
        {"role": "system" if m.role == "developer" else m.role, "content": _text(m)}
        for m in messages
    ]


def structure_size(messages: list[ChatMessage]) -> int:
    """What translating messages costs, by their number and their parts' (as
    off_loop.work_size counts a message: MESSAGE_CHARS)."""
    if len(messages) * MESSAGE_CHARS > INLINE_CHARS:  # big already: no need to walk it
        return len(messages) * MESSAGE_CHARS
    parts = sum(len(m.content) for m in messages if isinstance(m.content, list))
    return (len(messages) + parts) * MESSAGE_CHARS


def stop_list(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def prefix_cache_salt(tenant: str, client_salt: str | None) -> str | None:
    """The engine's prefix-cache salt: tenants never share KV blocks (a prefix hit is
    fast, so shared blocks would let one tenant time another's prompts), and a client's
    own `cache_salt` narrows sharing within its tenant. Hashed: the tenant's name is not
    sent to remote engines. None (share freely) for the open single-user gateway."""
    if tenant == OPEN_TENANT and client_salt is None:
        return None
    key = json.dumps([tenant, client_salt])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def check_model(model: str, models: list[str]) -> None:
    """503 while no model is served yet; 404 for a model not served."""
    if not models:
        raise APIError(503, "no model is ready yet", "service_unavailable")
    if model not in models:
        raise APIError(
            404,
            f"The model {model!r} does not exist; available: {', '.join(models)}",
            param="model",
            code="model_not_found",
        )


def request_fields(request: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """The fields the client set, by OpenAI's names, as plain values (null ones left
    out): CompletionJob.fields and CacheRequest.fields."""
    given = ((name, getattr(request, name)) for name in request.__struct_fields__)
    return {name: msgspec.to_builtins(value) for name, value in given if value is not None}


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


def max_tokens_of(asked: int | None, default_cap: int | None) -> tuple[int | None, bool]:
    """A job's max_tokens (None: up to the context) and whether it is the server's default
    cap: the client's, else that cap. The one place that decides it: the engine generates
    at most that, a cached answer is served only within it (gateway/replay.py) and
    equivalent requests coalesce by it, so a hit and a miss agree on where an answer
    without max_tokens ends."""
    if asked is not None:
        return asked, False
    return default_cap, default_cap is not None


def chat_job(
    request: ChatCompletionRequest,
    request_id: str,
    model: str,
    tenant: str,
    default_max_tokens: int | None = None,
    trace_id: str | None = None,
    session: str | None = None,
) -> CompletionJob:
    """`request` as `model` runs it: the name it is served under (ModelRouter.route).
    `default_max_tokens` caps an answer whose request sets no max_tokens. `session` (the
    X-Session-Id header), else the end user's id, keeps the request on the remote server
    of its session's earlier ones."""
    asked = request.max_completion_tokens or request.max_tokens
    max_tokens, default_cap = max_tokens_of(asked, default_max_tokens)
    return CompletionJob(
        request_id=request_id,
        model=model,
        messages=flatten_messages(request.messages),
        max_tokens=max_tokens,
        default_cap=default_cap,
        trace_id=trace_id,
        session=session or request.user,
        **_asked_of(request, tenant),
    )


def _asked_of(request: ChatCompletionRequest | CompletionRequest, tenant: str) -> dict[str, Any]:
    """What a chat request and a text completion ask of the job alike: sampling, stops,
    the prefix cache's salt (the tenant's), a KV transfer, the fields given."""
    return {
        **sampling_given(request),
        "top_k": max(request.top_k or 0, 0),
        "stop": stop_list(request.stop),
        "seed": request.seed,
        "ignore_eos": request.ignore_eos,
        "cache_salt": prefix_cache_salt(tenant, request.cache_salt),
        "kv_transfer_params": request.kv_transfer_params,
        "fields": request_fields(request),
    }


def cache_request(job: CompletionJob, tenant: str) -> CacheRequest:
    """A chat job as the cache keys it: under its served model, in its tenant's scope."""
    return CacheRequest(
        model=job.model,
        messages=job.messages,
        tenant=tenant,
        temperature=job.temperature,
        fields=job.fields,
    )


def _prompt(prompt: str | list[str | int | list[int]]) -> str | list[int]:
    """One prompt: text or token ids, bare or as a list of one. Several prompts in one
    request (vLLM answers each as its own choice) are refused: send one request each."""
    one: str | list[int]
    if isinstance(prompt, str):
        one = prompt
    elif all(isinstance(t, int) for t in prompt):
        one = cast(list[int], prompt)
    elif len(prompt) == 1 and not isinstance(prompt[0], int):
        one = prompt[0]
    else:
        raise APIError(
            400, "only one prompt per request is supported", param="prompt", code=UNSUPPORTED
        )
    return one  # not empty: CompletionRequest's types say so


def text_job(
    request: CompletionRequest, models: list[str], tenant: str, default_max_tokens: int | None
) -> CompletionJob:
    """A text completion as the in-process engine runs it: its raw prompt, no template;
    without max_tokens, OpenAI's 16 (or the server's default cap, if lower)."""
    check_model(request.model, models)
    default = min(DEFAULT_TEXT_MAX_TOKENS, default_max_tokens or DEFAULT_TEXT_MAX_TOKENS)
    max_tokens, default_cap = max_tokens_of(request.max_tokens, default)
    return CompletionJob(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        model=request.model,
        messages=[],
        prompt=_prompt(request.prompt),
        max_tokens=max_tokens,
        default_cap=default_cap,
        **_asked_of(request, tenant),
    )


def echo_text(job: CompletionJob, upstream: Upstream) -> str:
    """The prompt as text, for `echo` (token ids decoded by the model's tokenizer)."""
    if isinstance(job.prompt, str):
        return job.prompt
    tokenizer = upstream.tokenizer(job.model)
    return tokenizer.decode(job.prompt) if tokenizer is not None and job.prompt else ""

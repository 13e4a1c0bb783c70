"""OpenAI's legacy text completions (POST /v1/completions, gateway/routes/
text_completions.py) on the in-process engine: the raw prompt, no chat template, never
cached (a prompt to continue is not a question). With upstreams the body is forwarded
as received (gateway/passthrough.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import cast

from gateway.completions import check_model, prefix_cache_salt
from gateway.errors import APIError
from gateway.schemas import CompletionRequest
from gateway.upstream import ChatJob, Upstream

# X-Cache-Bypass-Reason and the bypass counter's label.
BYPASS_REASON = "completions"
PATH = "/v1/completions"
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's

# What the engine cannot honour: a 400 naming the field, never silently ignored.
_UNSUPPORTED: tuple[tuple[Callable[[CompletionRequest], bool], str, str], ...] = (
    (lambda r: r.n not in (None, 1), "n", "only n=1 is supported"),
    (lambda r: r.best_of not in (None, 1), "best_of", "only best_of=1 is supported"),
    (lambda r: r.logprobs is not None, "logprobs", "logprobs are not supported"),
    (lambda r: bool(r.suffix), "suffix", "suffix is not supported"),
    (lambda r: bool(r.presence_penalty), "presence_penalty", "presence_penalty is not supported"),
    (
        lambda r: bool(r.frequency_penalty),
        "frequency_penalty",
        "frequency_penalty is not supported",
    ),
    (lambda r: bool(r.logit_bias), "logit_bias", "logit_bias is not supported"),
    (lambda r: r.top_k not in (None, -1, 0), "top_k", "top_k is not supported"),
    (lambda r: bool(r.min_p), "min_p", "min_p is not supported"),
    (
        lambda r: r.repetition_penalty not in (None, 1),
        "repetition_penalty",
        "repetition_penalty is not supported",
    ),
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
        raise APIError(400, "only one prompt per request is supported", param="prompt")
    if not one:
        raise APIError(400, "prompt must not be empty", param="prompt")
    return one


def to_text_job(request: CompletionRequest, models: list[str], tenant: str) -> ChatJob:
    """The request as the in-process engine runs it: its raw prompt, no template."""
    check_model(request.model, models)
    for unsupported, param, message in _UNSUPPORTED:
        if unsupported(request):
            raise APIError(400, f"{message} by the in-process engine", param=param)
    stop = request.stop
    return ChatJob(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        model=request.model,
        messages=[],
        prompt=_prompt(request.prompt),
        max_tokens=request.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        seed=request.seed,
        ignore_eos=request.ignore_eos,
        cache_salt=prefix_cache_salt(tenant, request.cache_salt),
    )


def echo_text(job: ChatJob, upstream: Upstream) -> str:
    """The prompt as text, for `echo` (token ids decoded by the model's tokenizer)."""
    if isinstance(job.prompt, str):
        return job.prompt
    tokenizer = upstream.tokenizer(job.model)
    return tokenizer.decode(job.prompt) if tokenizer is not None and job.prompt else ""

"""OpenAI's legacy text completions (POST /v1/completions, gateway/routes/
text_completions.py) on the in-process engine: the raw prompt, no chat template, never
cached (a prompt to continue is not a question). With upstreams the body is forwarded
as received (gateway/passthrough.py)."""

from __future__ import annotations

import uuid
from typing import cast

from gateway.bypass import SAMPLING_CHECKS, Checks, Unkeyable, first_applying
from gateway.chat_service import check_model, prefix_cache_salt, stop_list
from gateway.errors import UNSUPPORTED, APIError
from gateway.request_fields import sampling_given
from gateway.schemas import CompletionRequest
from gateway.upstream import ChatJob, Upstream

# X-Cache-Bypass-Reason and the bypass counter's label.
BYPASS_REASON = "completions"
PATH = "/v1/completions"
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's

# What the engine cannot honour: a 400 naming the field, never silently ignored. The
# sampling fields are chat's (gateway/bypass.py); these three only text completions have.
_UNSUPPORTED: Checks = (
    (lambda r: r.best_of not in (None, 1),
     Unkeyable("best_of", "best_of", "only best_of=1 is supported")),
    (lambda r: r.logprobs is not None,
     Unkeyable("logprobs", "logprobs", "logprobs are not supported")),
    (lambda r: bool(r.suffix), Unkeyable("suffix", "suffix", "suffix is not supported")),
    *SAMPLING_CHECKS,
)  # fmt: skip


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


def to_text_job(request: CompletionRequest, models: list[str], tenant: str) -> ChatJob:
    """The request as the in-process engine runs it: its raw prompt, no template."""
    check_model(request.model, models)
    if (found := first_applying(_UNSUPPORTED, request)) is not None:
        raise APIError(
            400, f"{found.message} by the in-process engine", param=found.param, code=UNSUPPORTED
        )
    return ChatJob(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        model=request.model,
        messages=[],
        prompt=_prompt(request.prompt),
        max_tokens=request.max_tokens or DEFAULT_MAX_TOKENS,
        **sampling_given(request),
        stop=stop_list(request.stop),
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

"""A cached answer, replayed: what a hit may serve, its headers, and its usage."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator

from cache import CacheEntry, Candidate
from gateway.tokens import token_counter
from gateway.upstream import CompletionJob, Delta, ModelRouter


def servable(job: CompletionJob, max_age: int | None, entry: CacheEntry) -> bool:
    """A cached answer must fit what this request allows: no older than its max-age,
    within its max_tokens and free of its stop sequences (otherwise another candidate,
    or the engine, answers)."""
    if max_age is not None and time.time() - entry.created > max_age:
        return False
    if job.max_tokens is not None:
        tokens = entry.metadata.get("completion_tokens")
        if not isinstance(tokens, int):
            # Unknown (seeded with no tokenizer at hand): a bound for byte-level BPE and
            # SentencePiece. No token is shorter than a byte; add a leading word marker
            # and the end-of-sequence token.
            tokens = len(entry.response.encode()) + 2
        if tokens > job.max_tokens:
            return False
    return not any(s in entry.response for s in job.stop)


def hit_headers(hit: Candidate) -> dict[str, str]:
    """X-Cache-Similarity, X-Cache-Entry, Age and, where known, X-Cache-Saved-Seconds."""
    entry = hit.entry
    headers = {
        "X-Cache-Similarity": f"{hit.similarity:.4f}",
        "X-Cache-Entry": entry.id,
        "Age": str(max(0, int(time.time() - entry.created))),
    }
    if (seconds := entry.generation_seconds) is not None:
        headers["X-Cache-Saved-Seconds"] = f"{seconds:.4f}"  # as stored: to 0.1 ms
    return headers


async def final_delta(
    entry: CacheEntry, job: CompletionJob, upstream: ModelRouter
) -> AsyncGenerator[Delta, None]:
    """The replay's final delta. Usage as the answer cost when it was generated (or
    counted when seeded): the counts stored with the entry, its original prompt's. All of
    that prompt was served from cache. A count the entry lacks (an upstream that sent no
    usage) is counted here where this gateway has the model's tokenizer (the prompt:
    this request's own)."""
    prompt = entry.metadata.get("prompt_tokens")
    completion = entry.metadata.get("completion_tokens")
    counter = None
    if not (isinstance(prompt, int) and isinstance(completion, int)):
        counter = token_counter(upstream, job.model)
    if counter is not None:
        if not isinstance(prompt, int):
            with contextlib.suppress(ValueError):  # the chat template refused them
                prompt = await counter.prompt(job.messages)
        if not isinstance(completion, int):
            completion = await counter.completion(entry.response)
    known = isinstance(prompt, int)
    yield Delta(
        finish_reason="stop",
        prompt_tokens=prompt if known else 0,
        completion_tokens=completion if isinstance(completion, int) else 0,
        cached_tokens=prompt if known else None,
    )

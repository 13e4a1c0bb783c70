"""What the in-process engine honours of what a request asks beyond one text answer
(cache/policy.py's asks): top_k, which its sampler takes beside temperature, top_p,
seed, stop and max_tokens, and kv_transfer_params (its KV store's P/D protocol).
Anything else asked is refused with a 400 naming the field, never silently ignored
(gateway/upstream/in_process.py's `supports`)."""

from __future__ import annotations

from cache.policy import CHAT_ASKS, SAMPLING_ASKS, Ask, first_asked, given
from gateway.upstream.base import CompletionJob, Unsupported

HONOURED = frozenset({"top_k", "kv_transfer_params"})

# A text completion's own (it is never cached, so the cache declares none of these); its
# `logprobs` is a count: any, 0 included, asks for them.
_TEXT_ASKS: tuple[Ask, ...] = (
    Ask("best_of", "best_of", "best_of > 1", given("best_of", 1)),
    Ask("logprobs", "logprobs", "logprobs", lambda f: f.get("logprobs") is not None),
    Ask("suffix", "suffix", "suffix", given("suffix")),
    *SAMPLING_ASKS,
)
_CHAT_REFUSED = tuple(a for a in CHAT_ASKS if a.name not in HONOURED)
_TEXT_REFUSED = tuple(a for a in _TEXT_ASKS if a.name not in HONOURED)


def unsupported(job: CompletionJob) -> Unsupported | None:
    """The first of what the job asks that the engine cannot honour, if any."""
    ask = first_asked(_CHAT_REFUSED if job.prompt is None else _TEXT_REFUSED, job.fields)
    if ask is None:
        return None
    return Unsupported(ask.param, f"{ask.what}: not supported by the in-process engine")

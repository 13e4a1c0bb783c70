"""Token counts, as the gateway's own model would count them, for text the model did not
produce: answers seeded into the cache, and the prompts of cache hits.

Only the tokenizer of a model the gateway runs itself is at hand (`Upstream.tokenizer`);
for a model served by remote upstreams there is no counter, and callers treat the counts
as unknown."""

from __future__ import annotations

from collections.abc import Sequence

from engine.tokenizer import Tokenizer
from gateway.off_loop import run_sized, work_size
from gateway.upstream import Upstream


class TokenCounter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    async def prompt(self, messages: Sequence[dict[str, str]]) -> int:
        """The prompt's tokens as the engine runs it: chat template, then encoded. Raises
        ValueError if the model's chat template refuses the messages."""
        return await run_sized(self._prompt, messages, work_size(messages))

    async def completion(self, answer: str) -> int:
        """The tokens of a complete answer as the engine counts a generated one: its text
        and the end-of-sequence token that ended it."""
        return await run_sized(self._completion, answer, len(answer))

    def _prompt(self, messages: Sequence[dict[str, str]]) -> int:
        return len(self.tokenizer.encode(self.tokenizer.apply_chat_template(messages)))

    def _completion(self, answer: str) -> int:
        return len(self.tokenizer.encode(answer, add_special_tokens=False)) + 1


def token_counter(upstream: Upstream, model: str) -> TokenCounter | None:
    """A counter for `model` if this gateway runs it itself, else None; 503 while that
    model is still loading (chat waits for it too)."""
    tokenizer = upstream.tokenizer(model)
    return None if tokenizer is None else TokenCounter(tokenizer)

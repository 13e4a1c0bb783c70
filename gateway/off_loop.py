"""Work on a request's text that grows with its size, kept off the event loop once the
request is big: one huge prompt must never stall every other client.

Size is characters and structure: the chat template renders, and the cache hashes, each
message, so 100,000 empty messages (3.3 MB) cost seconds with no characters at all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Work up to this size is done on the event loop (tokenizing 20,000 characters takes a
# few milliseconds); bigger in a worker thread, where tokenizers releases the GIL while it
# works and the interpreter switches threads every 5 ms otherwise.
INLINE_CHARS = 20_000
# What one message costs beyond its characters, counted as characters: rendering and
# hashing one takes about as long as tokenizing 200 characters.
MESSAGE_CHARS = 200


def work_size(messages: Sequence[dict[str, str]], prompt: str | list[int] | None = None) -> int:
    """The size of a request's work: a prompt's length, else the messages' characters
    plus MESSAGE_CHARS for each."""
    if prompt is not None:
        return len(prompt)
    return sum(len(m["content"]) for m in messages) + MESSAGE_CHARS * len(messages)


async def run_sized(work: Callable[[T], R], arg: T, size: int) -> R:
    """work(arg), in a worker thread when its work (`size`, as work_size counts) is big."""
    if size > INLINE_CHARS:
        return await asyncio.to_thread(work, arg)
    return work(arg)

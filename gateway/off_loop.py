"""Work on a request's text that grows with its length, kept off the event loop once
the text is long: one huge prompt must never stall every other client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Texts up to this many characters are handled on the event loop (tokenizing 20,000
# characters takes a few milliseconds); longer ones in a worker thread, where tokenizers
# releases the GIL while it works.
INLINE_CHARS = 20_000


async def run_sized(work: Callable[[T], R], arg: T, chars: int) -> R:
    """work(arg), in a worker thread when its text (`chars` long) is long."""
    if chars > INLINE_CHARS:
        return await asyncio.to_thread(work, arg)
    return work(arg)

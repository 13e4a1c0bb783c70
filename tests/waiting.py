"""Waiting for what the code under test brings about on its own time: a poll with a hang
guard, never a timing bound (a slow or shared machine only makes it wait longer)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    """Polls `check` until it holds; fails saying `what` if it has not after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


async def until_async(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    """`until` inside an event loop, whose tasks bring the condition about meanwhile."""
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None

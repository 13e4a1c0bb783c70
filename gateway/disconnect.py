"""Giving up a request's work when its client goes away before the response.

A streamed answer notices a closed connection on its next write (Litestar's SSE
response listens for it). A JSON answer writes nothing until it is complete, so
without this a client that timed out or hung up would keep its engine request
running, and its KV blocks held, to the last token. Like vLLM's
`with_cancellation`: the work races the ASGI `http.disconnect` message, and the
loser is cancelled (cancelling the answer's stream aborts its engine request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from litestar.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


async def _disconnect(receive: Receive) -> None:
    # The body is read by now: the next message the server has for us is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


class DisconnectWatch:
    """Watches one request's connection while its answer is prepared; `close()` it before
    the response starts (a streamed response listens for the disconnect itself)."""

    def __init__(self, receive: Receive) -> None:
        self._watcher = asyncio.ensure_future(_disconnect(receive))

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work`'s result; cancels it and raises ClientDisconnected if the client leaves
        first."""
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # our own cancellation (shutdown) cancels the work too
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task.cancelled() and self._watcher.done():
            self._watcher.result()  # a failed receive raises its own error here
            raise ClientDisconnected
        return task.result()

    def close(self) -> None:
        self._watcher.cancel()

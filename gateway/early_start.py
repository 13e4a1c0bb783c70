"""Starting the upstream while the cache is still being asked.

A miss would otherwise wait for the whole lookup (embedding the question, vector
search) before the engine even sees the request. With an early start the engine
begins prefilling at once; on a hit, or when the request ends up following an
equivalent one already in flight, the early request is aborted and its KV blocks
freed, having cost at most one lookup's worth of engine time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from gateway.upstream import Delta, UpstreamError


class EarlyStart:
    def __init__(self, stream: AsyncGenerator[Delta, None]) -> None:
        self._stream = stream
        self.sent = time.perf_counter()  # when the request went to the upstream
        # The task drives the upstream generator to its first delta right away; later
        # deltas are pulled by whoever consumes `deltas()` (never both at once).
        self._first: asyncio.Future[Delta] = asyncio.ensure_future(anext(stream))
        self._taken = False
        self.cancelled = False

    @property
    def turned_away(self) -> bool:
        """Refused for a full queue. Every request of a burst starts early, followers of
        another's flight too, and their places are given back only after their lookups:
        the request that leads asks again then, rather than failing for the others."""
        if not self._first.done() or self._first.cancelled():
            return False
        exc = self._first.exception()
        return isinstance(exc, UpstreamError) and exc.status == 429

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        """The whole answer, from the first delta; may be taken once."""
        assert not self._taken, "an early start is consumed once"
        self._taken = True
        try:
            yield await self._first
            async for delta in self._stream:
                yield delta
        except StopAsyncIteration:  # the upstream ended before any delta
            return
        finally:
            await self.cancel()

    async def cancel(self) -> None:
        """Aborts the upstream request (a no-op once it has finished)."""
        self.cancelled = True
        if not self._first.done():
            self._first.cancel()
        # wait() never raises the task's own outcome (the upstream's refusal does not
        # matter any more), while a cancellation of the caller still propagates.
        await asyncio.wait([self._first])
        if not self._first.cancelled():
            self._first.exception()  # retrieved: no "never retrieved" warning
        await self._stream.aclose()

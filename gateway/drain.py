"""Shutdown that drains. At the first SIGTERM (or Ctrl-C) uvicorn stops listening and
closes idle connections, /ready and new requests answer 503, and the requests in flight
have `grace` seconds to finish; whatever still runs then is ended cleanly (an SSE error
event and [DONE], or a 503), so no stream is cut and nothing is cancelled under uvicorn's
own timeout, which is set past the grace as a last resort only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn

log = logging.getLogger("semgate.gateway")

SHUTTING_DOWN = "the server is shutting down"
# uvicorn cancels what still runs this long after the grace: ending the requests at the
# grace takes the engine's shutdown (a second or two) and their last writes.
LAST_RESORT_SECONDS = 15.0


class Drain:
    def __init__(self, grace: float, end_in_flight: Callable[[], Awaitable[None]]) -> None:
        self.grace = grace
        self.end_in_flight = end_in_flight
        self.draining = False
        self._deadline: asyncio.Task[None] | None = None

    def begin(self) -> None:
        """On the event loop, at the first signal: from now on nothing new is accepted."""
        if self.draining:
            return
        self.draining = True
        log.info("shutting down: requests in flight have %g s to finish", self.grace)
        self._deadline = asyncio.get_running_loop().create_task(self._end_at_deadline())

    async def _end_at_deadline(self) -> None:
        await asyncio.sleep(self.grace)
        log.warning("shutdown grace (%g s) over: ending the requests still in flight", self.grace)
        await self.end_in_flight()

    async def stop(self) -> None:
        """At the application's shutdown (every connection is closed by then)."""
        if self._deadline is not None:
            self._deadline.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._deadline


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling `drain` when a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler runs between two bytecodes of whatever the loop is doing:
        # the drain begins on the loop's next turn.
        if self._loop is not None and sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.call_soon_threadsafe(self.drain.begin)
        super().handle_exit(sig, frame)

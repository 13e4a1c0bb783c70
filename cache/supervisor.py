"""Keeps watch over the cache's Redis, as a service manager would.

An embedded server that exits is reaped at once (no zombie) and restarted with
backoff on the same port and data directory: its append-only file brings the entries
back, and the clients reconnect on their next command. An external server (a given
URL) is not ours to restart: it is PINGed, and its state followed. Behind Redis Sentinel
that is the primary Sentinel names: down while none answers, up again once the promoted
replica does (the client asks the sentinels itself; a failover is logged). While Redis
is down, chat is answered uncached (the cache fails open) and the admin API says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import redis.asyncio as aioredis

from cache.redis_server import EmbeddedRedis
from cache.restart_backoff import RestartBackoff
from resilience.redis_url import primary_address

# The operator's log: the gateway prints `semgate.*` at INFO.
log = logging.getLogger("semgate.cache")

RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0)  # before each restart try; the last repeats
STABLE_SECONDS = 30.0  # up this long, the next exit starts the backoff over
POLL_SECONDS = 0.2  # embedded: how often its process is polled (a waitpid, no I/O)
PING_SECONDS = 1.0  # external: how often it is PINGed (also the PING's time limit)


def describe_exit(status: int) -> str:
    """Popen.returncode in words: negative is the signal that killed the process."""
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-status).name}"
        return f"killed by signal {-status}"
    return f"exit status {status}"


class RedisSupervisor:
    """`up` and `down_reason` are the cache's state as /ready and the admin API report
    it; `restarts` counts the embedded server's restarts that came up."""

    def __init__(self, client: aioredis.Redis, server: EmbeddedRedis | None = None) -> None:
        self.client = client
        self.server = server
        self.up = True
        self.down_reason: str | None = None
        self.restarts = 0
        # Behind Sentinel: the primary last seen (the store's connections have found one).
        self._primary = primary_address(client)
        self._task: asyncio.Task[None] | None = None
        self._backoff = RestartBackoff(RESTART_DELAYS, STABLE_SECONDS)

    def start(self) -> None:
        watch = self._watch_process() if self.server is not None else self._watch_pings()
        self._task = asyncio.get_running_loop().create_task(watch)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # A restart under way: waited for before anyone stops the server under it.
        if self._backoff.pending is not None:
            await asyncio.wait([self._backoff.pending])

    def _down(self, reason: str) -> None:
        self.up, self.down_reason = False, reason

    def _back_up(self) -> None:
        self.up, self.down_reason = True, None

    async def _watch_process(self) -> None:
        server = self.server
        assert server is not None
        backoff = self._backoff
        while True:
            await asyncio.sleep(POLL_SECONDS)
            pid, status = server.pid, server.poll()
            if status is None:
                continue
            backoff.went_down()
            exited = describe_exit(status)
            self._down(f"the embedded Redis exited ({exited}) and is being restarted")
            log.warning("embedded Redis (pid %s) exited (%s): serving uncached, restarting "
                        "it in %.1f s", pid, exited, backoff.delay)  # fmt: skip
            while True:
                try:
                    await backoff.attempt(server.restart)
                    break
                except Exception as exc:
                    log.error("embedded Redis did not restart (%s): next try in %.1f s",
                              exc, backoff.delay)  # fmt: skip
            # The pool's connections died with the old server: drop them, so that no
            # command is sent on one; new ones are made on demand.
            await self.client.connection_pool.disconnect()
            self.restarts += 1
            self._back_up()
            log.info("embedded Redis restarted (pid %s, restart %d) after %.1f s down: cache "
                     "back on", server.pid, self.restarts, backoff.down_seconds)  # fmt: skip

    async def _watch_pings(self) -> None:
        while True:
            await asyncio.sleep(PING_SECONDS)
            try:
                async with asyncio.timeout(PING_SECONDS):
                    await self.client.ping()
            except Exception as exc:
                if self.up:
                    log.warning("Redis does not answer (%r): serving uncached until it does", exc)
                self._down(f"no answer to PING ({exc!r})")
                continue
            if not self.up:
                log.info("Redis answers again: cache back on")
                self._back_up()
            self._follow_primary()

    def _follow_primary(self) -> None:
        """Logs when Sentinel has named another primary (a failover) since it was seen."""
        primary = primary_address(self.client)
        if primary is None or primary == self._primary:
            return
        if self._primary is not None:
            log.warning("Redis Sentinel failed over: the primary is now %s:%s (was %s:%s)",
                        *primary, *self._primary)  # fmt: skip
        self._primary = primary

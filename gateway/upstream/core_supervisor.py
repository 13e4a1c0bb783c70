"""Keeps the in-process engine's core process serving, as cache/supervisor.py keeps the
embedded Redis.

A core that exits (a crash, the OOM killer, `kill -9`) is reaped and started again. A
core that shows no progress for `hang_seconds` while it holds requests (`kill -STOP`, a
deadlock), or that does not answer a probe for as long while idle (it is probed every
PROBE_SECONDS), counts as hung: it is unready at once, then killed and started again.
(Unprobed, an idle hung core was ready until a request had waited out the timeout.) Either
way the requests it held fail with EngineDeadError, which the gateway answers cleanly
(503, or an SSE error event and [DONE]); meanwhile the gateway is unready and cache hits
are still served.

The hang is watched from a thread of its own, not the event loop: sends to a stopped
core block once its pipe is full, and the kill is what unblocks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter

from cache import RestartBackoff
from engine import AsyncLLM, EngineConfig

log = logging.getLogger("semgate.engine")

RESTART_DELAYS = (0.0, 1.0, 2.0, 5.0, 10.0)  # before each restart; the last repeats
STABLE_SECONDS = 30.0  # up this long, the next failure starts the backoff over
POLL_SECONDS = 0.1
PROBE_SECONDS = 1.0  # between probes of an idle core (a message each way)
# Consecutive failed loads after which the process cannot mend itself: /health turns 503
# so that a liveness probe restarts it (the supervisor keeps trying meanwhile).
BROKEN_AFTER = 5


class CoreSupervisor:
    def __init__(self, config: EngineConfig, hang_seconds: float) -> None:
        self.config = config
        self.hang_seconds = hang_seconds
        self.llm: AsyncLLM | None = None  # the core now (a dead one until replaced)
        self.restarts: Counter[str] = Counter()  # by cause: "exited", "hung"
        self.failed_loads = 0  # consecutive restarts whose load failed
        self._hung: AsyncLLM | None = None  # the core the watchdog killed for a hang
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._backoff = RestartBackoff(RESTART_DELAYS, STABLE_SECONDS)

    async def start(self) -> None:
        """Loads the first core (its failure is raised: nothing to restart yet), then
        watches it."""
        self.llm = await asyncio.to_thread(AsyncLLM, self.config)
        self._task = asyncio.get_running_loop().create_task(self._watch())
        threading.Thread(target=self._watchdog, name="semgate-core-watchdog", daemon=True).start()

    async def stop(self, reason: str = "engine is shut down") -> None:
        """Stops watching and shuts the core down; its streams fail with `reason`.
        Idempotent."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # A load under way: waited for, and what it started is shut down below.
        loading = self._backoff.pending
        if loading is not None:
            await asyncio.wait([loading])
            if not loading.cancelled() and loading.exception() is None:
                self.llm = loading.result()
        if self.llm is not None:
            await asyncio.to_thread(self.llm.shutdown, reason)

    @property
    def ready(self) -> bool:
        llm = self.llm
        return (
            llm is not None
            and not self._stopping
            and llm.stopped is None
            and llm.stalled_for() <= self.hang_seconds
        )

    @property
    def down_reason(self) -> str | None:
        """Why a loaded core serves no requests now, else None."""
        llm = self.llm
        if llm is None or self.ready:
            return None
        if llm.stopped is None:
            return f"the engine core has made no progress for {llm.stalled_for():.0f} s"
        if self._stopping:
            return llm.stopped
        return f"{llm.stopped}; restarting the engine core"

    @property
    def broken(self) -> bool:
        return self.failed_loads >= BROKEN_AFTER

    def _watchdog(self) -> None:
        """Probes an idle core, and kills one that shows no progress (holding requests,
        or probed) for hang_seconds."""
        probed = 0.0
        while not self._stopping:
            time.sleep(POLL_SECONDS)
            llm = self.llm
            if llm is None or llm.stopped is not None or llm is self._hung:
                continue
            if time.monotonic() - probed >= PROBE_SECONDS:
                probed = time.monotonic()
                llm.probe()
            if llm.stalled_for() > self.hang_seconds:
                self._hung = llm
                reason = f"the engine core made no progress for {self.hang_seconds:g} s (hung)"
                log.error("%s: killing it", reason)
                llm.kill_core(reason)

    async def _watch(self) -> None:
        backoff = self._backoff
        while True:
            await asyncio.sleep(POLL_SECONDS)
            llm = self.llm
            if llm is None or llm.stopped is None:
                continue
            backoff.went_down()
            cause = "hung" if llm is self._hung else "exited"
            log.error("%s: restarting the engine core; its requests failed", llm.stopped)
            await asyncio.to_thread(llm.shutdown)  # reaps the process, joins its reader
            while True:
                try:
                    self.llm = await backoff.attempt(lambda: AsyncLLM(self.config))
                    break
                except Exception as exc:
                    self.failed_loads += 1
                    log.error("the engine core did not restart (try %d): %s", backoff.tries, exc)
            self.failed_loads = 0
            self.restarts[cause] += 1
            log.info("engine core restarted after %.1f s down (%s; restart %d)",
                     backoff.down_seconds, cause, self.restarts.total())  # fmt: skip

"""The engine core in a process of its own: the step loop behind `AsyncLLM`.

On a thread of the caller's process the step loop needs the GIL for its Python work
(scheduling, bookkeeping, detokenizing) between tensor ops, and a server's event loop
needs it for HTTP and cache work: each stalls the other. As in vLLM's V1 EngineCore,
the loop runs in a child process instead and talks to its client over a pipe:
requests and aborts in, each step's new tokens and the engine's stats out.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.logs import current_format, formatter
from engine.metrics import EngineStats
from engine.outputs import CoreOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.step_window import StepTime

log = logging.getLogger("semgate.engine")


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]  # validated by the client
    params: SamplingParams
    cache_salt: str | None
    arrival_time: float  # time.perf_counter(): CLOCK_MONOTONIC, the same in every process
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class Probe:
    """Asks an idle core to report: one that does not is hung (AsyncLLM.probe)."""


@dataclass(frozen=True)
class CoreReady:
    """The child's first message once the model is loaded."""

    max_model_len: int
    vocab_size: int
    attention_backend: str
    graph_mode: str  # how decode steps run: eager, or CUDA graphs for which batch sizes


@dataclass(frozen=True)
class RequestFailure:
    request_id: str
    message: str
    invalid: bool  # the request was refused (ValueError), not failed by a step


@dataclass(frozen=True)
class StepReport:
    outputs: list[CoreOutput]
    failures: list[RequestFailure]
    stats: EngineStats
    step: StepTime | None  # the step it follows; None after messages only (or a failed step)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The outputs travel as columns, one tuple a field, and the step as a plain tuple:
        # a NamedTuple pickles through a Python call per item, 7x a tuple's cost, and of
        # a step's 64 outputs most fields are the same False or None (columns pickled
        # in 12 us where the tuples of each output took 17, and unpickled in half).
        columns = tuple(zip(*self.outputs, strict=True))
        step = None if self.step is None else tuple(self.step)
        return _step_report, (columns, self.failures, self.stats, step)


def _step_report(
    columns: tuple[tuple[Any, ...], ...],
    failures: list[RequestFailure],
    stats: EngineStats,
    step: tuple[float, int, int] | None,
) -> StepReport:
    outputs = list(map(_new_output, zip(*columns, strict=True)))
    return StepReport(outputs, failures, stats, None if step is None else StepTime(*step))


# A CoreOutput from its fields' tuple, without NamedTuple's Python-level __new__.
_new_output = functools.partial(tuple.__new__, CoreOutput)


ClientMessage = AddRequest | AbortRequest | Probe | None  # None: shut down

# Seconds the loop sleeps at most when its requests wait on KV transfers; their threads
# wake it sooner.
IDLE_POLL = 0.05


# `-c`, not `-m engine.core_process`: as __main__ the module's message classes would not
# be the ones the client unpickles.
CORE_COMMAND = "from engine.core_process import main; main()"


def start_engine_core(
    config: EngineConfig, log_level: int
) -> tuple[subprocess.Popen[bytes], Connection]:
    """Starts the core (`python -c CORE_COMMAND FD`) and sends it its config; the
    caller then receives `CoreReady` or the exception that stopped the load. A fresh
    interpreter rather than multiprocessing's spawn: that would re-import the caller's
    main script, which breaks scripts without a `__main__` guard; and no fork, which is
    unsafe once torch has threads or CUDA."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    # The caller's import path, as spawn would pass it (a checkout that is not installed).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with theirs:
        process = subprocess.Popen(
            [sys.executable, "-c", CORE_COMMAND, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
        )
    conn = Connection(ours.detach())
    conn.send((config, log_level, current_format()))
    return process, conn


def main() -> None:
    """The child process: load the model, report ready (or the error), then serve steps
    until the client says stop or goes away."""
    # Ctrl-C reaches the whole process group, and a service manager's SIGTERM may reach
    # the whole cgroup; the client decides when the core stops (after draining).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(sys.argv[1]))
    config, log_level, log_format = conn.recv()
    _nice(config.core_nice)
    _log_to_stderr(log_level, log_format)
    try:
        engine = LLMEngine(config)
    except Exception as exc:
        conn.send(exc)
        return
    ready = CoreReady(
        engine.max_model_len,
        engine.model_config.vocab_size,
        engine.runner.attention.name,
        engine.runner.graph_mode,
    )
    conn.send(ready)
    # What exists now (the model, the engine) lives as long as the process: the cyclic
    # collector leaves it alone from here on, so a full collection in the step loop only
    # scans what the steps made (vLLM's engine core freezes its heap too).
    gc.freeze()
    _CoreLoop(engine, conn).run()
    engine.close()


def _nice(nice: int) -> None:
    """Niceness is per thread on Linux, and importing torch has started a thread already:
    each thread there is now gets it (those started later take their starter's)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():  # not Linux: niceness is the process's
        os.nice(nice)
        return
    for tid in tasks.iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that has ended since
            os.setpriority(os.PRIO_PROCESS, int(tid.name), nice)


def _log_to_stderr(level: int, log_format: str) -> None:
    handler = logging.StreamHandler()
    text = "%(asctime)s %(levelname)-7s %(name)s (engine core %(process)d): %(message)s"
    handler.setFormatter(formatter(log_format, text))
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").addHandler(handler)
    root = logging.getLogger("semgate")
    root.setLevel(level)
    root.addHandler(handler)


class _CoreLoop:
    def __init__(self, engine: LLMEngine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.inbox: queue.SimpleQueue[ClientMessage] = queue.SimpleQueue()
        self.wake = threading.Event()
        if engine.kv_connector is not None:  # a load or a save done wakes an idle loop
            engine.kv_connector.on_progress(self.wake.set)
        threading.Thread(target=self._receive, name="semgate-core-inbox", daemon=True).start()

    def _receive(self) -> None:
        """Empties the pipe as messages come, even during a long step, so the client's
        sends never wait on a full pipe."""
        while True:
            try:
                message: ClientMessage = self.conn.recv()
            except (EOFError, OSError):  # the client is gone
                message = None
            self.inbox.put(message)
            self.wake.set()
            if message is None:
                return

    def run(self) -> None:
        engine = self.engine
        while True:
            messages: list[ClientMessage] = []
            while not self.inbox.empty():
                messages.append(self.inbox.get())
            if any(m is None for m in messages):
                return
            outputs, failures = self._apply(messages)
            stepped = engine.has_unfinished()
            if stepped:
                outputs += self._step(failures)
            step = engine.last_step if stepped else None
            news = messages or outputs or failures or step is not None
            if news and not self._report(outputs, failures, step):
                return
            if not engine.has_unfinished():
                self.wake.wait()
                self.wake.clear()
            elif step is None:
                # Nothing could run: the requests wait on the KV connector, which wakes
                # the loop when a load or a save is done (a new message does too).
                self.wake.wait(IDLE_POLL)
                self.wake.clear()

    def _apply(
        self, messages: list[ClientMessage]
    ) -> tuple[list[CoreOutput], list[RequestFailure]]:
        """Adds and aborts requests, in the order they were sent."""
        outputs: list[CoreOutput] = []
        failures: list[RequestFailure] = []
        for message in messages:
            if message is None or isinstance(message, Probe):  # a message: it is reported
                continue
            if isinstance(message, AbortRequest):
                if (out := self.engine.abort(message.request_id)) is not None:
                    outputs.append(out)
                continue
            seq = Sequence(
                message.request_id,
                message.prompt_token_ids,  # checked by the client (AsyncLLM.generate)
                message.params,
                message.cache_salt,
                message.kv_transfer_params,
            )
            seq.metrics.arrival_time = message.arrival_time
            try:
                self.engine.add_sequence(seq)
            except ValueError as exc:  # its id is already running
                failures.append(RequestFailure(message.request_id, str(exc), invalid=True))
        return outputs, failures

    def _report(
        self, outputs: list[CoreOutput], failures: list[RequestFailure], step: StepTime | None
    ) -> bool:
        """Sends what changed and the stats; False once the client is gone."""
        report = StepReport(outputs, failures, self.engine.get_stats(window=False), step)
        try:
            self.conn.send(report)
        except OSError:
            return False
        return True

    def _step(self, failures: list[RequestFailure]) -> list[CoreOutput]:
        try:
            return self.engine.step()
        except Exception as exc:  # keep serving: fail the requests in flight, not the core
            log.exception("engine step failed; aborting the requests in flight")
            for rid in list(self.engine.sequences):
                self.engine.abort(rid)
                failures.append(RequestFailure(rid, f"engine step failed: {exc}", invalid=False))
            return []

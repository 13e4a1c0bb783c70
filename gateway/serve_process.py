"""`semgate serve` as a child process on a free loopback port: what the benchmarks and
the HTTP tests drive. Its output goes to a file, so a full pipe can never block it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cache.redis_server import free_port


@dataclass
class ServeProcess:
    args: list[str]  # `semgate serve` flags beyond --host and --port
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="semgate-", suffix=".log")[1])
    )
    startup_statuses: list[int] = field(default_factory=list)  # /ready answers while starting
    # /ready is 200 once chat is answered, perhaps uncached yet: wait for the cache too
    # (unless it is meant to stay down), so that what runs next finds it up.
    wait_for_cache: bool = True
    env: dict[str, str] = field(default_factory=dict)  # beyond this process's own
    # Another checkout's code to run instead of this one's (a benchmark's baseline).
    checkout: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        cmd = [sys.executable, "-m", "cli.main", "serve", "--host", "127.0.0.1"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", **self.env}
        if self.checkout is not None:
            env["PYTHONPATH"] = str(self.checkout)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--port", str(self.port), *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.checkout,
            )
        return self

    def wait_ready(self, timeout: float = 180) -> ServeProcess:
        """Polls /ready until 200 (and the cache not "down", if waited for); raises with
        the log's tail if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                ready = httpx.get(self.url + "/ready", timeout=5)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            self.startup_statuses.append(ready.status_code)
            if ready.status_code == 200 and (
                not self.wait_for_cache or ready.json()["cache"] != "down"
            ):
                return self
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signals the server (its embedded Redis dies with it) and waits; kills if hung."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


@contextlib.contextmanager
def serving(*servers: ServeProcess) -> Iterator[list[ServeProcess]]:
    """Starts every server at once (their models load side by side), waits until all
    are ready, and stops them all on leaving."""
    try:
        for server in servers:
            server.start()
        yield [server.wait_ready() for server in servers]
    finally:
        for server in servers:
            server.stop()

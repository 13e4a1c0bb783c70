"""Real `semgate serve` processes for the HTTP tests: each on a free loopback port,
logging to a file (so a full pipe can never block it), killed with its tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    args: list[str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="semgate-", suffix=".log")[1])
    )
    startup_statuses: list[int] = field(default_factory=list)  # /ready answers while starting

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1"]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--port", str(self.port), *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
            )
        return self

    def wait_ready(self, timeout: float = 180) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                status = httpx.get(self.url + "/ready", timeout=5).status_code
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            self.startup_statuses.append(status)
            if status == 200:
                return self
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def metric(server: Server, name: str) -> float:
    """One unlabelled sample from the server's /metrics."""
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")

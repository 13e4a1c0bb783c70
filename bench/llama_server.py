"""llama.cpp's `llama-server` as a benchmark side: found, started on a free local port,
sent greedy completions of token ids, stopped."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

BUNDLED = Path(__file__).resolve().parents[2] / ".venv/llama.cpp/bin/llama-server"
HOW_TO_GET = "build one with scripts/build-llama-server, or set LLAMA_SERVER to its path"
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 600.0


def find_llama_server(explicit: Path | None = None) -> Path | None:
    """explicit, else $LLAMA_SERVER, else llama-server on PATH, else the one
    scripts/build-llama-server builds; None when there is none."""
    env = os.environ.get("LLAMA_SERVER")
    on_path = shutil.which("llama-server")
    for candidate in (explicit, env, on_path, BUNDLED):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def llama_server_version(binary: Path) -> str:
    """What `llama-server --version` prints (to stderr), e.g. "version: 6500 (abc1234)"."""
    done = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return (done.stdout + done.stderr).strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process: `slots` requests decode at once (continuous batching),
    more wait for a free slot. A context manager: started on entry, stopped on exit."""

    def __init__(
        self, binary: Path, model: Path, threads: int, slots: int = 8, ctx: int = 8192
    ) -> None:
        self.binary = binary
        self.model = model
        self.threads = threads
        self.slots = slots
        self.ctx = ctx  # shared by the slots
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._logs: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Starts the server, its output to a log file in a temporary directory, and waits
        until GET /health answers 200 (the model is loaded)."""
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        args: list[str | Path] = [self.binary, "-m", self.model]
        args += ["--host", "127.0.0.1", "--port", str(port)]
        args += ["-t", str(self.threads), "-c", str(self.ctx), "-np", str(self.slots)]
        args += ["--cont-batching"]
        self._logs = tempfile.TemporaryDirectory(prefix="llama-server-")
        log_path = Path(self._logs.name) / "llama-server.log"
        with log_path.open("wb") as log:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(self._proc)
        except RuntimeError as e:
            log_tail = log_path.read_text(errors="replace")[-3000:]
            self.stop()
            raise RuntimeError(f"{e}; its log ends:\n{log_tail}") from None

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1, trust_env=False).is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not ready after {START_TIMEOUT_S:g} s")

    def stop(self) -> None:
        """Terminates the server (kills it if it lingers) and removes its log."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._logs is not None:
            self._logs.cleanup()
            self._logs = None

    def _body(self, prompt_ids: list[int], n: int) -> dict[str, Any]:
        return {
            "prompt": prompt_ids,
            "n_predict": n,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
            "stream": False,
        }

    @staticmethod
    def _timings(response: httpx.Response, n: int) -> dict[str, Any]:
        response.raise_for_status()
        timings = response.json()["timings"]
        if timings["predicted_n"] != n:
            raise RuntimeError(f"llama-server generated {timings['predicted_n']} of {n} tokens")
        return timings

    def complete(self, prompt_ids: list[int], n: int) -> dict[str, Any]:
        """Exactly n greedy tokens after the prompt; the server's timings (predicted_n,
        predicted_ms from the first token to the last, prompt_n, prompt_ms, ...)."""
        response = httpx.post(
            f"{self.url}/completion",
            json=self._body(prompt_ids, n),
            timeout=REQUEST_TIMEOUT_S,
            trust_env=False,
        )
        return self._timings(response, n)

    async def complete_all(self, requests: list[tuple[list[int], int]]) -> list[dict[str, Any]]:
        """Every (prompt ids, n) request sent at once; their timings in the same order."""
        limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=self.url, timeout=REQUEST_TIMEOUT_S, limits=limits, trust_env=False
        ) as client:
            responses = await asyncio.gather(
                *(client.post("/completion", json=self._body(p, n)) for p, n in requests)
            )
        return [self._timings(r, n) for r, (_, n) in zip(responses, requests, strict=True)]

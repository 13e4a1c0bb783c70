"""The HTTP tests' servers: real `semgate serve` processes (gateway.serve_process)."""

from __future__ import annotations

import httpx

from cache.redis_server import free_port
from gateway.serve_process import ServeProcess as Server
from gateway.serve_process import serving

__all__ = ["MODEL", "Server", "free_port", "metric", "serving"]

MODEL = "smollm2-135m-instruct"


def metric(server: Server, sample: str, missing: float | None = None) -> float:
    """One sample from the server's /metrics, by name and labels as exported
    (`name{label="value"}`); `missing` for a labelled sample not observed yet."""
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    if missing is None:
        raise AssertionError(f"{sample} not exported")
    return missing

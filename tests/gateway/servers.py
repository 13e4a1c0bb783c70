"""The HTTP tests' servers: real `semgate serve` processes (gateway.serve_process)."""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.probe import probed
from cache.redis_server import free_port
from gateway.serve_process import ServeProcess as Server
from gateway.serve_process import serving
from tests.waiting import until

__all__ = [
    "MODEL",
    "Server",
    "caching_server",
    "free_port",
    "metric",
    "probed",
    "ready",
    "serving",
    "value_in",
    "wait_for_idle_engine",
]

MODEL = "smollm2-135m-instruct"


def caching_server(tmp_path_factory: pytest.TempPathFactory, flags: list[str]) -> Server:
    """A `semgate serve` with the cache on, its embedded Redis keeping its data in a
    directory of its own (one Redis a data directory)."""
    return Server(["--redis-data-dir", str(tmp_path_factory.mktemp("redis")), *flags])


def metric(server: Server, sample: str, missing: float | None = None) -> float:
    """A sample from the server's /metrics, named as exported with some of its labels
    (`name{label="value"}`): the sum of the samples of that name whose labels include
    those (one per model_name, where every series has it); `missing` for a labelled
    sample not observed yet."""
    return value_in(httpx.get(server.url + "/metrics").text, sample, missing)


def value_in(text: str, sample: str, missing: float | None = None) -> float:
    """`metric`, from a scrape already made."""
    name, _, rest = sample.partition("{")
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and wanted.items() <= s.labels.items()
    ]
    if values:
        return sum(values)
    if missing is None:
        raise AssertionError(f"{sample} not exported")
    return missing


ENGINE_GAUGES = (
    "semgate_num_requests_running",
    "semgate_num_requests_waiting",
    "semgate_kv_cache_usage_perc",
)


def ready(server: Server) -> httpx.Response:
    return httpx.get(server.url + "/ready", timeout=10)


def wait_for_idle_engine(server: Server, timeout: float = 10) -> None:
    """Waits until the engine reports nothing running, waiting or in the KV cache. The
    engine core is a child process that applies aborts and reports its gauges after the
    gateway has moved on, so a test reads them only once they settle (a hang guard, not
    a timing bound)."""

    def idle() -> bool:
        text = httpx.get(server.url + "/metrics").text  # one scrape for the three gauges
        return not any(value_in(text, g) for g in ENGINE_GAUGES)

    until("the engine is idle", idle, timeout)

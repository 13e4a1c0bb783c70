"""A remote engine's running and waiting requests, read from its Prometheus /metrics:
semgate's names, vLLM's or SGLang's (summed over their labels)."""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

_NAMES = {
    "semgate_num_requests_running": "running",
    "vllm:num_requests_running": "running",
    "semgate_num_requests_waiting": "waiting",
    "vllm:num_requests_waiting": "waiting",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
}


class RemoteLoad(NamedTuple):
    running: int | None  # None: the server exports no such gauge
    waiting: int | None


UNKNOWN_LOAD = RemoteLoad(None, None)


def parse_load(text: str) -> RemoteLoad:
    """The two gauges from an exposition text. Only their own lines are parsed: a
    server's whole /metrics is tens of kilobytes, read every health interval."""
    wanted = "\n".join(
        line for line in text.splitlines() if line.split("{", 1)[0].split(" ", 1)[0] in _NAMES
    )
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            key = _NAMES.get(sample.name)
            if key is not None:
                sums[key] = sums.get(key, 0.0) + sample.value
    return RemoteLoad(*(_count(sums.get(key)) for key in ("running", "waiting")))


def _count(value: float | None) -> int | None:
    return None if value is None else round(value)

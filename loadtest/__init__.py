"""semgate's load generator: drives any OpenAI-compatible endpoint over HTTP (streaming chat
completions), records TTFT, inter-token gaps, end-to-end latency, tokens, cache status and
errors per request, and writes summaries, plots and scenario comparisons.

The names below load on first use, so `semgate --help` does not import the whole package.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Endpoint": "loadtest.client",
    "LoadShape": "loadtest.runner",
    "LoadTest": "loadtest.load",
    "RequestRecord": "loadtest.record",
    "RunResult": "loadtest.runner",
    "SCENARIOS": "loadtest.scenarios",
    "WorkItem": "loadtest.workload",
    "WorkloadOptions": "loadtest.workload",
    "build_workload": "loadtest.workload",
    "run_load": "loadtest.runner",
    "run_load_test": "loadtest.load",
    "summarize": "loadtest.summary",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loadtest' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

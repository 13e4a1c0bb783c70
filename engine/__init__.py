"""semgate's inference engine: continuous batching over a paged KV cache.

The names below load on first use (PEP 562), so that importing a torch-free module of
the engine (engine.options: `semgate serve --help`, the gateway's settings) loads no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM, AsyncLLM, EngineDeadError
    from engine.llm_engine import LLMEngine
    from engine.metrics import EngineStats, RequestMetrics
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams

# Each public name's module.
_HOMES = {
    "LLM": "engine.llm",
    "AsyncLLM": "engine.llm",
    "EngineConfig": "engine.config",
    "EngineDeadError": "engine.llm",
    "EngineStats": "engine.metrics",
    "LLMEngine": "engine.llm_engine",
    "RequestMetrics": "engine.metrics",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = [
    "LLM",
    "AsyncLLM",
    "EngineConfig",
    "EngineDeadError",
    "EngineStats",
    "LLMEngine",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # found directly from now on
    return value

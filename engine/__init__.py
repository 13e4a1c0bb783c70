"""semgate's inference engine: continuous batching over a paged KV cache."""

from engine.config import EngineConfig
from engine.llm import LLM, AsyncLLM, EngineDeadError
from engine.llm_engine import LLMEngine
from engine.metrics import EngineStats, RequestMetrics
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

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

"""Where cache misses are answered: the in-process engine or remote servers."""

from gateway.upstream.base import (
    CompletionJob,
    Delta,
    EngineGauges,
    Unsupported,
    Upstream,
    UpstreamError,
    UpstreamHealth,
)
from gateway.upstream.http import HttpUpstream
from gateway.upstream.in_process import InProcessEngine
from gateway.upstream.model_router import ModelRouter

__all__ = [
    "CompletionJob",
    "Delta",
    "EngineGauges",
    "HttpUpstream",
    "InProcessEngine",
    "ModelRouter",
    "Unsupported",
    "Upstream",
    "UpstreamError",
    "UpstreamHealth",
]

"""Where cache misses are answered: the in-process engine or remote servers."""

from gateway.upstream.base import (
    ChatJob,
    Delta,
    EngineGauges,
    Upstream,
    UpstreamError,
    UpstreamHealth,
)
from gateway.upstream.http import HttpUpstream
from gateway.upstream.in_process import InProcessEngine
from gateway.upstream.model_router import ModelRouter
from gateway.upstream.openai_wire import ForwardedJob

__all__ = [
    "ChatJob",
    "Delta",
    "EngineGauges",
    "ForwardedJob",
    "HttpUpstream",
    "InProcessEngine",
    "ModelRouter",
    "Upstream",
    "UpstreamError",
    "UpstreamHealth",
]

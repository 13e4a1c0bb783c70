"""GET /admin/engine/stats: the in-process engine's live load and, over the last minute,
how its step time split between prefill and decode (engine/step_window.py)."""

from __future__ import annotations

import msgspec
from litestar import get

from engine.metrics import EngineStats
from engine.step_window import StepWindowStats
from gateway.errors import APIError
from gateway.openapi_docs import error_responses
from gateway.runtime import Runtime
from gateway.upstream import EngineGauges


class StepKindView(msgspec.Struct):
    steps: int
    seconds: float  # inside those steps
    tokens: int  # prefill: prompt tokens computed; decode: tokens computed (drafts included)
    mean_step_ms: float | None
    share: float | None  # of the step time in the window


class LastMinuteView(msgspec.Struct):
    window_seconds: float  # 60, or the time since the engine started
    busy_fraction: float  # of the window spent inside steps
    prefill: StepKindView  # steps with any prefill chunk (their decodes riding along)
    decode: StepKindView  # steps of decodes and verifications only


class EngineStatsView(msgspec.Struct):
    model: str
    attention_backend: str  # "flash", "cpu" or "torch" (engine/attention_backends.py)
    decode_steps: str  # "eager", or the batch sizes captured as CUDA graphs
    running: int
    waiting: int
    kv_cache_usage: float  # fraction of KV blocks in use
    num_preemptions: int  # since start
    prefix_cache_hit_rate: float | None  # of prompt tokens looked up since start
    spec_method: str | None
    spec_acceptance_rate: float | None  # of proposed tokens since start
    last_minute: LastMinuteView

    @classmethod
    def of(cls, g: EngineGauges, s: EngineStats) -> EngineStatsView:
        """The gauges of a running engine (`s`: their stats) in this view's units."""
        return cls(
            model=g.model,
            attention_backend=g.attention_backend,
            decode_steps=g.decode_steps,
            running=s.num_running,
            waiting=s.num_waiting,
            kv_cache_usage=round(s.kv_cache_usage, 4),
            num_preemptions=s.num_preemptions,
            prefix_cache_hit_rate=_round(s.prefix_cache_hit_rate),
            spec_method=s.spec_method,
            spec_acceptance_rate=_round(s.spec_acceptance_rate),
            last_minute=last_minute(s.steps),
        )


def _kind(steps: int, seconds: float, tokens: int, total: float) -> StepKindView:
    return StepKindView(
        steps=steps,
        seconds=round(seconds, 4),
        tokens=tokens,
        mean_step_ms=round(1000 * seconds / steps, 3) if steps else None,
        share=round(seconds / total, 4) if total else None,
    )


def last_minute(w: StepWindowStats) -> LastMinuteView:
    total = w.prefill_seconds + w.decode_seconds
    return LastMinuteView(
        window_seconds=round(w.window_seconds, 3),
        busy_fraction=round(w.busy_fraction, 4),
        prefill=_kind(w.prefill_steps, w.prefill_seconds, w.prefill_tokens, total),
        decode=_kind(w.decode_steps, w.decode_seconds, w.decode_tokens, total),
    )


def _round(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 4)


@get(
    "/engine/stats",
    summary="The in-process engine's load and its step time, prefill against decode",
    responses=error_responses(401, 403, 404, 429, 503),
)
async def engine_stats(runtime: Runtime) -> EngineStatsView:
    if not runtime.settings.runs_engine:
        raise APIError(
            404,
            "no engine runs in this gateway (it forwards to upstreams): "
            "ask each engine server's /admin/engine/stats",
            code="no_engine",
        )
    g = runtime.upstream.gauges()
    if g is None or g.stats is None:  # loading, or its core is being restarted
        why = runtime.upstream.failure or "the model is still loading"
        raise APIError(503, why, "service_unavailable", "engine_loading", retry_after=2)
    return EngineStatsView.of(g, g.stats)

"""The engine core's host time per decode step: what a CUDA graph cannot remove.

On a GPU the model's forward becomes one graph replay, and what is left of a step is
the engine core's Python: scheduling, building the inputs, the sampler's bookkeeping,
appending tokens, the step's outputs and the report the core process sends. This
measures that part on a CPU: `streams` requests decode `tokens` tokens each on one
thread, and each decode step's thread CPU time (robust to other processes sharing
the cores) less the time inside the model's forward, its LM head and the sampler.
"""

from __future__ import annotations

import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.core_process import StepReport
from engine.llm_engine import LLMEngine
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams


def _counted(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - started

    return timed


def host_time_per_decode_step(model: str, streams: int = 64, tokens: int = 256) -> dict[str, Any]:
    """Median and mean host milliseconds of the decode steps of `streams` x `tokens`."""
    config = EngineConfig(model, max_num_seqs=streams, num_threads=1, kv_cache_memory=512 << 20)
    engine = LLMEngine(config)
    device = [0.0]
    engine.model.forward = _counted(engine.model.forward, device)  # type: ignore[method-assign]
    engine.model.compute_logits = _counted(engine.model.compute_logits, device)  # type: ignore[method-assign]
    # Counted as the sampler it is (its generator stays where the runner reads it).
    sampler = engine.runner.sampler
    sampler.__class__ = type(
        "CountedSampler", (Sampler,), {"__call__": _counted(Sampler.__call__, device)}
    )
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(streams):
        engine.add_request(f"Request number {i}: tell me about the history of", params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.sequences.values()):
        engine.step()
    hosts = []
    while engine.has_unfinished():
        device[0] = 0.0
        started = time.thread_time()
        outputs = engine.step()
        report = StepReport(outputs, [], engine.get_stats(window=False), engine.last_step)
        pickle.dumps(report)
        hosts.append(time.thread_time() - started - device[0])
    return {
        "streams": streams,
        "tokens": tokens,
        "steps": len(hosts),
        "median_ms": statistics.median(hosts) * 1000,
        "mean_ms": statistics.mean(hosts) * 1000,
    }

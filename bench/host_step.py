"""The engine core's host time per decode step: what a CUDA graph cannot remove.

On a GPU the model's forward becomes one graph replay, and what is left of a step is
the engine core's Python: scheduling, building the inputs, the sampler's bookkeeping,
appending tokens, the step's outputs and the report the core process sends. This
measures that part on a CPU: `streams` requests decode `tokens` tokens each on one
thread, and each decode step's thread CPU time (robust to other processes sharing
the cores) less the time inside the model's forward, its LM head and the sampler.

`semgate bench host-step --baseline DIR` measures another checkout the same way (say,
`git worktree add --detach /tmp/before 001c401`, the engine before issue 37), each
measurement in a process of its own, the two checkouts alternating, and reports the
medians and the median ratio.
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

import engine.core_process as core_process
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.options import DEFAULT_MODEL
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams

DEFAULT_OUT = Path("bench-results/host-step.json")


def _counted(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - started

    return timed


def host_time_per_decode_step(
    model: str, streams: int = 64, tokens: int = 256, async_scheduling: bool = False
) -> dict[str, Any]:
    """Median and mean host milliseconds of the decode steps of `streams` x `tokens`.
    With async_scheduling the forward and the sampler run on the runner's worker thread
    (engine/async_step.py): the stepping thread's time is all host time."""
    # Named only when on: a baseline checkout's EngineConfig may not have it.
    ahead: dict[str, Any] = {"async_scheduling": True} if async_scheduling else {}
    config = EngineConfig(
        model, max_num_seqs=streams, num_threads=1, kv_cache_memory=512 << 20, **ahead
    )
    engine = LLMEngine(config)
    device = [0.0]
    if not async_scheduling:
        for name in ("forward", "compute_logits"):
            setattr(engine.model, name, _counted(getattr(engine.model, name), device))
        # Counted as the sampler it is (its generator stays where the runner reads it).
        sampler = engine.runner.sampler
        sampler.__class__ = type(
            "CountedSampler", (Sampler,), {"__call__": _counted(Sampler.__call__, device)}
        )
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(streams):
        engine.add_request(f"Request number {i}: tell me about the history of", params)
    seqs = engine.sequences.values()
    if async_scheduling:  # until each has its first token (its prompt is computed sooner)
        while any(not s.metrics.token_times for s in seqs):
            engine.step()
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in seqs):
        engine.step()
    hosts = []
    while engine.has_unfinished():
        device[0] = 0.0
        started = time.thread_time()
        outputs = engine.step()
        pickle.dumps(_report(engine, outputs))
        hosts.append(time.thread_time() - started - device[0])
    return {
        "async_scheduling": async_scheduling,
        "streams": streams,
        "tokens": tokens,
        "steps": len(hosts),
        "median_ms": statistics.median(hosts) * 1000,
        "mean_ms": statistics.mean(hosts) * 1000,
    }


def _report(engine: LLMEngine, outputs: list[Any]) -> core_process.StepReport:
    """The report the core process sends after a step. A checkout from before issue 37
    (a --baseline) stepped whole RequestOutputs, which its core converted with
    CoreOutput.of, and its get_stats took no window argument."""
    core_output: Any = getattr(core_process, "CoreOutput", None)
    if hasattr(core_output, "of"):
        outputs = [core_output.of(out) for out in outputs]
        stats = engine.get_stats()
    else:
        stats = engine.get_stats(window=False)
    return core_process.StepReport(outputs, [], stats, engine.last_step)


def _measure(
    checkout: Path, model: str, tokens: int, async_scheduling: bool = False
) -> dict[str, Any]:
    """host_time_per_decode_step in a fresh process, importing the engine of `checkout`
    (this file runs there as a script)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, __file__, model, str(tokens), *(["async"] if async_scheduling else [])],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"measuring {checkout} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def run_host_step_bench(
    quick: bool = False,
    out_path: Path | None = DEFAULT_OUT,
    baseline: Path | None = None,
    model: str = DEFAULT_MODEL,
    async_scheduling: bool = False,
) -> dict[str, Any]:
    """This checkout's host time per decode step (with async_scheduling: the stepping
    thread's, the forward on its worker), and with a baseline checkout both,
    alternating (5 pairs; --quick: 1 pair of 16-token streams)."""
    console = Console()
    tokens, rounds = (16, 1) if quick else (256, 5)
    here = Path(__file__).resolve().parent.parent
    checkouts = {"this checkout": here}
    if baseline is not None:
        checkouts["baseline"] = baseline.resolve()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    for round_ in range(rounds):
        for name, checkout in checkouts.items():
            result = _measure(checkout, model, tokens, async_scheduling and name != "baseline")
            runs[name].append(result)
            console.print(f"round {round_ + 1}, {name}: median {result['median_ms']:.3f} ms")
    each = {name: [r["median_ms"] for r in rs] for name, rs in runs.items()}
    medians = {name: statistics.median(values) for name, values in each.items()}
    report: dict[str, Any] = {
        "baseline": str(baseline or ""),
        "async_scheduling": async_scheduling,
        "runs": runs,
        "median_ms": medians,
    }
    summary = ", ".join(f"{name} {ms:.3f} ms" for name, ms in medians.items())
    if baseline is not None:
        ratios = [a / b for a, b in zip(each["this checkout"], each["baseline"], strict=True)]
        report["median_ratio"] = statistics.median(ratios)
        summary += f"; ratio {report['median_ratio']:.3f}"
    streams = runs["this checkout"][0]["streams"]
    console.print(
        f"host time per decode step, {streams} streams x {tokens} tokens, "
        f"medians of {rounds}: {summary}"
    )
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    ahead = sys.argv[3:] == ["async"]
    print(
        json.dumps(
            host_time_per_decode_step(sys.argv[1], tokens=int(sys.argv[2]), async_scheduling=ahead)
        )
    )

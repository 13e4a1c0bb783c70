"""`semgate bench engine`: our engine against Hugging Face transformers, in one process.

Every comparison runs on ShareGPT prompts, greedy, with EOS ignored so that
both sides generate exactly the same number of tokens:

1. Single-stream decode speed, prefill left out. Ours: (N - 1) / the sum of
   the request's N - 1 inter-token latencies. Transformers: the same prompt
   timed for N new tokens and for 1; (N - 1) / (t_N - t_1).
2. Throughput: every request in one `LLM.generate` call (continuous batching)
   against transformers serving them one by one, and in static batches of 8
   (left padded; a batch runs to its longest request, but only each request's
   own tokens count). Output tokens / wall time, prefill included.
3. Chunked prefill: 8 streams decode, and a few steps later a long prompt
   arrives. Its prefill can stall the streams only between its arrival and its
   first token, so the stall is measured on the streams' inter-token latencies
   that end in that window: over whole 200-token streams the one stall per
   stream is under 1% of the latencies and would hide below p99. Steady state
   is the same streams, past the same point, with no long prompt.
4. Prefix caching: time to first token of a request whose ~1,500-token prefix
   another request has just computed, against that first (cold) request.

The timing-based comparisons alternate their sides (A, B, A, B, ...) and report
medians, because the machine may be shared.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.greedy import greedy, warm_up
from bench.host_step import host_time_per_decode_step
from bench.report import (
    fmt,
    median,
    met_cell,
    progress,
    rotated,
    summary_ms,
    write_report,
)
from bench.sharegpt import sample_requests, token_stream
from engine.config import EngineConfig
from engine.llm import LLM
from engine.metrics import RequestMetrics
from engine.options import DEFAULT_MODEL

DEFAULT_OUT = Path("bench-results/engine.json")
T = TypeVar("T")
Request = tuple[list[int], int]  # prompt token ids, number of tokens to generate


@dataclass(frozen=True)
class Sizes:
    repeats: int  # alternations of each timing-based comparison
    single_prompts: int
    single_new_tokens: int
    num_requests: int
    max_prompt_len: int
    max_output_len: int
    hf_batch_size: int
    throughput_repeats: int
    num_streams: int
    stream_tokens: int
    stream_warmup_steps: int  # decode steps of the streams before the long prompt arrives
    long_prompt_len: int
    prefix_len: int
    suffix_len: int


FULL = Sizes(
    repeats=3,
    single_prompts=3,
    single_new_tokens=64,
    num_requests=64,
    max_prompt_len=256,
    # transformers one by one (~17 tok/s on 2 CPU cores) dominates the run: 64-token
    # outputs keep the whole benchmark near 8 minutes there.
    max_output_len=64,
    hf_batch_size=8,
    throughput_repeats=1,
    num_streams=8,
    stream_tokens=200,
    stream_warmup_steps=4,
    long_prompt_len=2000,
    prefix_len=1500,
    suffix_len=32,
)
QUICK = Sizes(
    repeats=2,
    single_prompts=1,
    single_new_tokens=16,
    num_requests=8,
    max_prompt_len=128,
    max_output_len=24,
    hf_batch_size=8,
    throughput_repeats=1,
    num_streams=8,
    stream_tokens=40,
    stream_warmup_steps=2,
    long_prompt_len=512,
    prefix_len=384,
    suffix_len=16,
)


@dataclass(frozen=True)
class Goal:
    name: str
    label: str
    unit: str
    ours: float
    baseline: float
    ratio: float
    op: str  # ">=" or "<=": how ratio must compare with target
    target: float

    @property
    def met(self) -> bool:
        return self.ratio >= self.target if self.op == ">=" else self.ratio <= self.target


class HFReference:
    """transformers' own model on the same weights, device and dtype as our engine."""

    def __init__(self, config: EngineConfig, pad_token_id: int) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        path = config.model_path
        # Any: mypy cannot call the `to` that transformers wraps with functools.wraps.
        model: Any
        # The GGUF converter draws its own tqdm bar over our progress display.
        with contextlib.redirect_stderr(io.StringIO()):
            if path.suffix == ".gguf":
                model = AutoModelForCausalLM.from_pretrained(
                    path.parent, gguf_file=path.name, dtype=config.torch_dtype
                )
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=config.torch_dtype)
        self.device = torch.device(config.device)
        self.model = model.to(self.device).eval()
        self.pad_token_id = pad_token_id

    def time_generate(self, prompts: list[list[int]], new_tokens: int) -> float:
        """Seconds to generate exactly new_tokens greedy tokens after each prompt, as one batch."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        self._sync()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # EOS is masked out, so no row stops early
                pad_token_id=self.pad_token_id,
            )
        self._sync()
        elapsed = time.perf_counter() - start
        if out.shape[1] != width + new_tokens:
            raise RuntimeError(f"transformers generated {out.shape[1] - width} of {new_tokens}")
        return elapsed

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# 1. Single-stream decode


def bench_single_stream(
    llm: LLM, hf: HFReference, prompts: list[list[int]], sizes: Sizes, progress: Progress
) -> tuple[dict[str, Any], list[Goal]]:
    n = sizes.single_new_tokens
    ours: list[float] = []
    theirs: list[float] = []

    def run_ours(prompt: list[int]) -> None:
        itl = llm.generate(prompt, greedy(n))[0].metrics.itl
        ours.append(len(itl) / sum(itl))

    def run_hf(prompt: list[int]) -> None:
        t_1 = hf.time_generate([prompt], 1)
        t_n = hf.time_generate([prompt], n)
        theirs.append((n - 1) / (t_n - t_1))

    task = progress.add_task("1/4 single-stream decode", total=sizes.repeats * len(prompts))
    for r in range(sizes.repeats):
        for prompt in prompts:
            for side in rotated([run_ours, run_hf], r):
                side(prompt)
            progress.advance(task)
    result: dict[str, Any] = {
        "new_tokens": n,
        "prompt_lens": [len(p) for p in prompts],
        "ours_tok_s": median(ours),
        "hf_tok_s": median(theirs),
        "ours_samples": ours,
        "hf_samples": theirs,
    }
    result["speedup"] = result["ours_tok_s"] / result["hf_tok_s"]
    goal = Goal(
        "single_stream_decode",
        "decode, 1 stream",
        "tok/s",
        result["ours_tok_s"],
        result["hf_tok_s"],
        result["speedup"],
        ">=",
        1.5,
    )
    return result, [goal]


# 2. Throughput


def bench_throughput(
    llm: LLM, hf: HFReference, requests: list[Request], sizes: Sizes, progress: Progress
) -> tuple[dict[str, Any], list[Goal]]:
    total = sum(n for _, n in requests)
    task = progress.add_task("2/4 throughput (tokens)", total=3 * sizes.throughput_repeats * total)

    def ours() -> float:
        start = time.perf_counter()
        outs = llm.generate([p for p, _ in requests], [greedy(n) for _, n in requests])
        elapsed = time.perf_counter() - start
        if sum(len(o.token_ids) for o in outs) != total:
            raise RuntimeError("our engine generated a different number of tokens than asked")
        progress.advance(task, total)
        return elapsed

    def one_by_one() -> float:
        elapsed = 0.0
        for prompt, n in requests:
            elapsed += hf.time_generate([prompt], n)
            progress.advance(task, n)
        return elapsed

    def static_batches() -> float:
        elapsed = 0.0
        for i in range(0, len(requests), sizes.hf_batch_size):
            batch = requests[i : i + sizes.hf_batch_size]
            elapsed += hf.time_generate([p for p, _ in batch], max(n for _, n in batch))
            progress.advance(task, sum(n for _, n in batch))
        return elapsed

    sides: dict[str, Callable[[], float]] = {
        "ours": ours,
        "hf_one_by_one": one_by_one,
        "hf_static_batch": static_batches,
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(sizes.throughput_repeats):
        for name in rotated(list(sides), r):
            seconds[name].append(sides[name]())
    tok_s = {name: total / median(s) for name, s in seconds.items()}
    result: dict[str, Any] = {
        "num_requests": len(requests),
        "output_tokens": total,
        "hf_batch_size": sizes.hf_batch_size,
        "seconds": seconds,
        "tok_s": tok_s,
        "speedup_vs_one_by_one": tok_s["ours"] / tok_s["hf_one_by_one"],
        "speedup_vs_static_batch": tok_s["ours"] / tok_s["hf_static_batch"],
    }
    goals = [
        Goal(
            "throughput_vs_one_by_one",
            f"{len(requests)} reqs vs HF 1 by 1",
            "tok/s",
            tok_s["ours"],
            tok_s["hf_one_by_one"],
            result["speedup_vs_one_by_one"],
            ">=",
            4.0,
        ),
        Goal(
            "throughput_vs_static_batch",
            f"{len(requests)} reqs vs HF batch {sizes.hf_batch_size}",
            "tok/s",
            tok_s["ours"],
            tok_s["hf_static_batch"],
            result["speedup_vs_static_batch"],
            ">=",
            2.0,
        ),
    ]
    return result, goals


# 3. Chunked prefill stall


def _ttft_ms(metrics: RequestMetrics) -> float:
    """The time to first token of a request that has one, in ms."""
    assert metrics.ttft is not None
    return metrics.ttft * 1000


def _itl_stats(itls: Sequence[float]) -> dict[str, float]:
    return {**summary_ms(itls), "max_ms": 1e3 * max(itls)}


def _itls_between(streams: list[RequestMetrics], after: float, until: float) -> list[float]:
    """Inter-token latencies of the streams whose later token came in (after, until]."""
    return [
        itl
        for m in streams
        for t, itl in zip(m.token_times[1:], m.itl, strict=True)
        if after < t <= until
    ]


def stall_run(
    llm: LLM, streams: list[list[int]], long_prompt: list[int] | None, sizes: Sizes
) -> dict[str, Any]:
    """Decodes the streams; after they have all started, the long prompt (if any) arrives."""
    seen: dict[str, RequestMetrics] = {}

    def step() -> None:
        for out in llm.step():
            seen[out.request_id] = out.metrics

    ids = [llm.add_request(p, greedy(sizes.stream_tokens)) for p in streams]
    while len(seen) < len(ids):  # until every stream has its first token
        step()
    for _ in range(sizes.stream_warmup_steps):
        step()
    arrival = time.perf_counter()
    long_id = llm.add_request(long_prompt, greedy(1)) if long_prompt else None
    while llm.has_unfinished():
        step()
    metrics = [seen[i] for i in ids]
    result: dict[str, Any] = {"after_arrival": _itl_stats(_itls_between(metrics, arrival, np.inf))}
    if long_id is not None:
        first_token = seen[long_id].token_times[0]
        if any(m.token_times[-1] <= first_token for m in metrics):
            raise ValueError("the streams ended before the long prompt's prefill did")
        result["window"] = _itl_stats(_itls_between(metrics, arrival, first_token))
        result["long_prompt_ttft_ms"] = _ttft_ms(seen[long_id])
    return result


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one kind of run, statistic by statistic."""
    summary: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, dict):
            summary[key] = {stat: median([r[key][stat] for r in runs]) for stat in first}
        else:
            summary[key] = median([r[key] for r in runs])
    return summary


def bench_stall(
    chunked: LLM,
    unchunked: LLM,
    streams: list[list[int]],
    long_prompt: list[int],
    sizes: Sizes,
    progress: Progress,
) -> tuple[dict[str, Any], list[Goal]]:
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "steady": lambda: stall_run(chunked, streams, None, sizes),
        "chunked_on": lambda: stall_run(chunked, streams, long_prompt, sizes),
        "chunked_off": lambda: stall_run(unchunked, streams, long_prompt, sizes),
    }
    task = progress.add_task("3/4 chunked-prefill stall", total=sizes.repeats * len(runs))
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for r in range(sizes.repeats):
        for name in rotated(list(runs), r):
            samples[name].append(runs[name]())
            progress.advance(task)
    summary = {name: _summarize(runs_) for name, runs_ in samples.items()}
    on, off = (summary[k]["window"]["p99_ms"] for k in ("chunked_on", "chunked_off"))
    steady = summary["steady"]["after_arrival"]["p99_ms"]
    result = {
        "num_streams": len(streams),
        "stream_tokens": sizes.stream_tokens,
        "long_prompt_len": len(long_prompt),
        "itl": summary,
        "runs": samples,
        "p99_off_over_on": off / on,
        "p99_on_over_steady": on / steady,
    }
    goals = [
        Goal(
            "stall_p99_on_vs_off",
            "stall p99, chunk on/off",
            "ms",
            on,
            off,
            off / on,
            ">=",
            3.0,
        ),
        Goal(
            "stall_p99_on_vs_steady",
            "stall p99, on/steady",
            "ms",
            on,
            steady,
            on / steady,
            "<=",
            3.0,
        ),
    ]
    return result, goals


# 4. Prefix caching


def bench_prefix(
    llm: LLM, text: list[int], sizes: Sizes, progress: Progress
) -> tuple[dict[str, Any], list[Goal]]:
    p, s = sizes.prefix_len, sizes.suffix_len
    cold: list[RequestMetrics] = []
    warm: list[RequestMetrics] = []
    task = progress.add_task("4/4 prefix caching", total=sizes.repeats)
    for r in range(sizes.repeats):
        # Each repeat has its own prefix, so its first request finds nothing cached.
        base = text[r * (p + 2 * s) : (r + 1) * (p + 2 * s)]
        prefix = base[:p]
        cold.append(llm.generate(prefix + base[p : p + s], greedy(1))[0].metrics)
        warm.append(llm.generate(prefix + base[p + s :], greedy(1))[0].metrics)
        progress.advance(task)
    cold_ms = [_ttft_ms(m) for m in cold]
    warm_ms = [_ttft_ms(m) for m in warm]
    result: dict[str, Any] = {
        "prefix_len": p,
        "prompt_len": p + s,
        "cold_ttft_ms": median(cold_ms),
        "cached_ttft_ms": median(warm_ms),
        "cold_samples_ms": cold_ms,
        "cached_samples_ms": warm_ms,
        "cold_cached_tokens": [m.num_cached_tokens for m in cold],
        "cached_cached_tokens": [m.num_cached_tokens for m in warm],
    }
    result["speedup"] = result["cold_ttft_ms"] / result["cached_ttft_ms"]
    goal = Goal(
        "prefix_ttft",
        f"TTFT, {p} cached/cold",
        "ms",
        result["cached_ttft_ms"],
        result["cold_ttft_ms"],
        result["speedup"],
        ">=",
        5.0,
    )
    return result, [goal]


# The run


def _run_all(
    model: str, sizes: Sizes, progress: Progress, async_scheduling: bool
) -> tuple[dict[str, Any], list[Goal]]:
    loading = progress.add_task("loading engines, transformers and ShareGPT", total=None)
    # Prefix caching off for 1-3: repeated prompts must not get cache hits HF cannot have.
    load_started = time.perf_counter()
    ahead = async_scheduling
    llm = LLM(EngineConfig(model, prefix_caching=False, async_scheduling=ahead))
    ours_load_s = time.perf_counter() - load_started
    tok = llm.tokenizer
    sampled = sample_requests(tok, sizes.num_requests, sizes.max_prompt_len, sizes.max_output_len)
    requests = [(tok.encode(prompt), n) for prompt, n in sampled]
    span = sizes.prefix_len + 2 * sizes.suffix_len
    text = token_stream(tok, sizes.long_prompt_len + sizes.repeats * span)
    load_started = time.perf_counter()
    hf = HFReference(llm.engine.config, pad_token_id=min(tok.eos_token_ids, default=0))
    hf_load_s = time.perf_counter() - load_started
    warm_up(llm)
    hf.time_generate([requests[0][0]], 2)
    progress.update(loading, total=1, completed=1)

    # Model files to a ready engine (weights, tokenizer, KV cache), imports excluded.
    results: dict[str, Any] = {"load": {"ours_s": ours_load_s, "hf_s": hf_load_s, "goal_s": 3.0}}
    single = [p for p, _ in requests[: sizes.single_prompts]]
    results["single_stream"], g1 = bench_single_stream(llm, hf, single, sizes, progress)
    results["throughput"], g2 = bench_throughput(llm, hf, requests, sizes, progress)
    del hf

    unchunked = LLM(
        EngineConfig(model, chunked_prefill=False, prefix_caching=False, async_scheduling=ahead)
    )
    warm_up(unchunked)
    streams = [p for p, _ in requests[: sizes.num_streams]]
    long_prompt = text[: sizes.long_prompt_len]
    results["chunked_prefill"], g3 = bench_stall(
        llm, unchunked, streams, long_prompt, sizes, progress
    )
    del unchunked, llm

    cached = LLM(EngineConfig(model, async_scheduling=ahead))
    config = cached.engine.config
    warm_up(cached)
    results["prefix_caching"], g4 = bench_prefix(
        cached, text[sizes.long_prompt_len :], sizes, progress
    )
    goals = [*g1, *g2, *g3, *g4]
    results["attention_backend"] = cached.engine.runner.attention.name
    results["decode_steps"] = cached.engine.runner.graph_mode
    del cached
    host = progress.add_task("host time per decode step, 64 streams", total=None)
    results["host_step"] = host_time_per_decode_step(model, async_scheduling=ahead)
    progress.update(host, total=1, completed=1)
    results["device"] = config.device
    results["dtype"] = config.dtype
    results["quantization"] = config.quantization
    return results, goals


def _round_toward_miss(goal: Goal) -> float:
    """The ratio to 2 decimals, rounded away from the target so a miss never reads as met."""
    rounding = math.floor if goal.op == ">=" else math.ceil
    return rounding(goal.ratio * 100) / 100


def goal_table(goals: list[Goal]) -> Table:
    table = Table(title="semgate engine vs transformers (baseline)")
    for name in ("Comparison", "Unit", "Ours", "Baseline", "Ratio", "Goal", "Met"):
        table.add_column(name, justify="left" if name in ("Comparison", "Unit") else "right")
    for g in goals:
        table.add_row(
            g.label,
            g.unit,
            fmt(g.ours),
            fmt(g.baseline),
            f"{_round_toward_miss(g):.2f}x",
            f"{g.op} {g.target:g}x",
            met_cell(g.met),
        )
    return table


_RUN_LABELS = {
    "steady": "steady state",
    "chunked_on": "chunking on",
    "chunked_off": "chunking off",
}


def itl_table(stall: dict[str, Any]) -> Table:
    table = Table(
        title=f"ITL of {stall['num_streams']} streams, {stall['long_prompt_len']}-token prompt "
        "arriving (ms, medians)",
        caption="window: from the long prompt's arrival to its first token; "
        "whole: every ITL after its arrival",
    )
    columns = ("Run", "window p50", "p99", "max", "whole p50", "p99", "long TTFT")
    for name in columns:
        table.add_column(name, justify="left" if name == "Run" else "right")
    for run, stats in stall["itl"].items():
        window = stats.get("window")
        cells = [f"{window[k]:,.0f}" if window else "-" for k in ("p50_ms", "p99_ms", "max_ms")]
        cells += [f"{stats['after_arrival'][k]:,.0f}" for k in ("p50_ms", "p99_ms")]
        ttft = stats.get("long_prompt_ttft_ms")
        cells.append(f"{ttft:,.0f}" if ttft is not None else "-")
        table.add_row(_RUN_LABELS[run], *cells)
    return table


def run_engine_bench(
    quick: bool = False,
    out_path: Path = DEFAULT_OUT,
    model: str = DEFAULT_MODEL,
    console: Console | None = None,
    async_scheduling: bool = False,
) -> dict[str, Any]:
    """Runs the four comparisons, prints the tables, writes the numbers as JSON to out_path
    (our engine with async_scheduling as asked)."""
    console = console or Console()
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    with progress(console) as bar:
        results, goals = _run_all(model, sizes, bar, async_scheduling)
    report: dict[str, Any] = {
        "model": model,
        "quick": quick,
        "async_scheduling": async_scheduling,
        "sizes": asdict(sizes),
        **results,
        "goals": {g.name: {**asdict(g), "met": g.met} for g in goals},
        "elapsed_s": time.perf_counter() - started,
    }
    write_report(out_path, report)
    weights = results["quantization"] or results["dtype"]
    console.print(
        f"Our weights: {weights} (transformers: {results['dtype']}); attention: "
        f"{results['attention_backend']}, decode steps: {results['decode_steps']}"
    )
    console.print(goal_table(goals))
    console.print(itl_table(results["chunked_prefill"]))
    load = results["load"]
    console.print(
        f"Load to ready: ours {load['ours_s']:.2f} s (goal < {load['goal_s']:g} s), "
        f"transformers {load['hf_s']:.1f} s"
    )
    host = results["host_step"]
    console.print(
        f"Engine core's host time per decode step, {host['streams']} streams x "
        f"{host['tokens']} tokens: median {host['median_ms']:.2f} ms (mean {host['mean_ms']:.2f})"
    )
    console.print(f"Wrote {out_path} in {report['elapsed_s']:.0f} s")
    return report

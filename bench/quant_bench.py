"""`semgate bench quant`: our engine's weight modes side by side, llama.cpp as the anchor.

Our engine runs with its linear layers' weights in float32, int8 and int4 (semgate's block
kernels where the CPU has AVX-512 VNNI, engine/block_quantized_linear.py, else aten's),
three engines built once and warmed up in one process; llama.cpp's `llama-server`
serves the same GGUF file with as many threads, when a binary is found (see
bench/llama_server.py). Every side gets the same token ids (one vocabulary), greedy,
with EOS ignored, so all generate exactly the requested number of tokens:

1. Single-stream decode speed, prefill left out: (N - 1) tokens over the time from the
   first token to the last. Ours: the sum of the request's N - 1 inter-token
   latencies. llama-server: its timings' `predicted_ms`, which runs from the first
   sampled token to the last, over `predicted_n - 1` (what its `predicted_per_second`
   reports in build 11434; older builds divided predicted_n by it, reading high).
2. Batch throughput: ShareGPT requests all at once. Ours: one `LLM.generate` call
   (continuous batching, up to 64 sequences a step). llama-server: every request sent
   concurrently, 8 slots decoding at a time. Output tokens / wall time, prefill
   included.

The sides alternate, in an order rotated each repeat, and medians are reported,
because the machine may be shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.greedy import greedy, warm_up
from bench.llama_server import (
    HOW_TO_GET,
    LlamaServer,
    find_llama_server,
    llama_server_version,
)
from bench.report import (
    fmt,
    median,
    met_cell,
    progress,
    rotated,
    write_report,
)
from bench.sharegpt import sample_requests
from engine.config import EngineConfig
from engine.llm import LLM
from engine.options import DEFAULT_MODEL

DEFAULT_OUT = Path("bench-results/quant.json")
MODES: dict[str, str | None] = {"float32": None, "int8": "int8", "int4": "int4"}
ANCHOR = "llama.cpp"
SLOTS = 8  # llama-server's parallel slots
T = TypeVar("T")
Request = tuple[list[int], int]  # prompt token ids, number of tokens to generate


@dataclass(frozen=True)
class Sizes:
    single_prompts: int
    single_repeats: int
    single_new_tokens: int
    num_requests: int
    max_prompt_len: int
    max_output_len: int
    batch_repeats: int


FULL = Sizes(
    single_prompts=3,
    single_repeats=3,
    single_new_tokens=128,
    num_requests=64,
    max_prompt_len=256,
    max_output_len=64,
    batch_repeats=2,
)
QUICK = replace(FULL, single_repeats=2, single_new_tokens=32, num_requests=16, batch_repeats=1)


@dataclass(frozen=True)
class Goal:
    name: str
    label: str
    ours: float
    baseline: float | None  # None: llama-server not available
    target: float  # ours / baseline must be at least this

    @property
    def ratio(self) -> float | None:
        return None if self.baseline is None else self.ours / self.baseline

    @property
    def met(self) -> bool | None:
        return None if self.ratio is None else self.ratio >= self.target


def _ours_decode(llm: LLM, n: int, prompt: list[int]) -> float:
    itl = llm.generate(prompt, greedy(n))[0].metrics.itl
    return len(itl) / sum(itl)


def _llama_decode(server: LlamaServer, n: int, prompt: list[int]) -> float:
    timings = server.complete(prompt, n)
    return (timings["predicted_n"] - 1) / (timings["predicted_ms"] / 1e3)


def _ours_batch(llm: LLM, requests: list[Request]) -> float:
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in requests], [greedy(n) for _, n in requests])
    elapsed = time.perf_counter() - start
    if sum(len(o.token_ids) for o in outs) != sum(n for _, n in requests):
        raise RuntimeError("our engine generated a different number of tokens than asked")
    return elapsed


def _llama_batch(server: LlamaServer, requests: list[Request]) -> float:
    start = time.perf_counter()
    asyncio.run(server.complete_all(requests))  # it checks each request's token count
    return time.perf_counter() - start


def _alternated(
    sides: dict[str, Callable[[T], float]], inputs: list[T], repeats: int, bar: Progress, label: str
) -> dict[str, list[float]]:
    """Each side's samples, one per input and repeat; the sides alternate, in an order
    rotated each repeat."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    task = bar.add_task(label, total=repeats * len(inputs))
    for r in range(repeats):
        for x in inputs:
            for name in rotated(list(sides), r):
                samples[name].append(sides[name](x))
            bar.advance(task)
    return samples


def _llama_server(
    binary: Path | None, config: EngineConfig
) -> tuple[LlamaServer | None, dict[str, Any]]:
    """The anchor's server, not started yet, and what the report says of it."""
    if binary is None:
        return None, {"not_available": f"llama-server not found: {HOW_TO_GET}"}
    if config.model_path.suffix != ".gguf":
        return None, {"not_available": "llama-server needs a .gguf model"}
    assert config.num_threads is not None  # EngineConfig gives it its default
    server = LlamaServer(binary, config.model_path, config.num_threads, slots=SLOTS)
    return server, {"binary": str(binary), "version": llama_server_version(binary), "slots": SLOTS}


def _run_all(model: str, sizes: Sizes, binary: Path | None, bar: Progress) -> dict[str, Any]:
    loading = bar.add_task("loading engines, llama-server and ShareGPT", total=None)
    llms = {
        mode: LLM(EngineConfig(model, quantization=q, prefix_caching=False))
        for mode, q in MODES.items()
    }
    for llm in llms.values():
        warm_up(llm)
    config, tok = llms["float32"].engine.config, llms["float32"].tokenizer
    sampled = sample_requests(tok, sizes.num_requests, sizes.max_prompt_len, sizes.max_output_len)
    requests = [(tok.encode(prompt), n) for prompt, n in sampled]
    prompts = [p for p, _ in requests[: sizes.single_prompts]]
    n = sizes.single_new_tokens
    decode: dict[str, Callable[[list[int]], float]] = {
        mode: partial(_ours_decode, llm, n) for mode, llm in llms.items()
    }
    batch: dict[str, Callable[[list[Request]], float]] = {
        mode: partial(_ours_batch, llm) for mode, llm in llms.items()
    }
    server, anchor = _llama_server(binary, config)
    if server is not None:
        decode[ANCHOR] = partial(_llama_decode, server, n)
        batch[ANCHOR] = partial(_llama_batch, server)
    with server or contextlib.nullcontext():
        if server is not None:
            server.complete(prompts[0], 4)  # warm-up
        bar.update(loading, total=1, completed=1)
        tok_s = _alternated(decode, prompts, sizes.single_repeats, bar, "1/2 single-stream decode")
        seconds = _alternated(batch, [requests], sizes.batch_repeats, bar, "2/2 batch throughput")
    total = sum(out_len for _, out_len in requests)
    return {
        "threads": config.num_threads,
        "llama_server": anchor,
        "single_stream": {
            "new_tokens": n,
            "prompt_lens": [len(p) for p in prompts],
            "samples_tok_s": tok_s,
            "tok_s": {name: median(s) for name, s in tok_s.items()},
        },
        "batch": {
            "num_requests": len(requests),
            "output_tokens": total,
            "samples_s": seconds,
            "tok_s": {name: total / median(s) for name, s in seconds.items()},
        },
    }


def _goals(results: dict[str, Any]) -> list[Goal]:
    single, batch = results["single_stream"]["tok_s"], results["batch"]["tok_s"]
    return [
        Goal(
            "int4_decode_vs_llama_cpp",
            "int4 / llama.cpp, 1 stream",
            single["int4"],
            single.get(ANCHOR),
            1.0,
        ),
        Goal(
            "int8_decode_vs_float32",
            "int8 / float32, 1 stream",
            single["int8"],
            single["float32"],
            2.0,
        ),
        Goal(
            "int4_batch_vs_llama_cpp",
            f"int4 / llama.cpp ({SLOTS} slots), batch",
            batch["int4"],
            batch.get(ANCHOR),
            1.0,
        ),
    ]


def sides_table(results: dict[str, Any]) -> Table:
    single, batch = results["single_stream"], results["batch"]
    missing = results["llama_server"].get("not_available")
    table = Table(title="Decode speed by weight mode (tok/s, medians)", caption=missing)
    table.add_column("Side")
    table.add_column(f"1 stream, {single['new_tokens']} tokens", justify="right")
    table.add_column(f"{batch['num_requests']} requests at once", justify="right")
    for side in [*MODES, ANCHOR]:
        if side in single["tok_s"]:
            table.add_row(side, fmt(single["tok_s"][side]), fmt(batch["tok_s"][side]))
        else:
            table.add_row(side, "not available", "not available")
    return table


def goal_table(goals: list[Goal]) -> Table:
    table = Table(title="Weight modes: goals")
    for name in ("Comparison", "Ours", "Baseline", "Ratio", "Goal", "Met"):
        table.add_column(name, justify="left" if name == "Comparison" else "right")
    for g in goals:
        # Ratios rounded down, so a miss never reads as met.
        ratio = "-" if g.ratio is None else f"{math.floor(g.ratio * 100) / 100:.2f}x"
        baseline = "not available" if g.baseline is None else fmt(g.baseline)
        table.add_row(g.label, fmt(g.ours), baseline, ratio, f">= {g.target:g}x", met_cell(g.met))
    return table


def run_quant_bench(
    quick: bool = False,
    out_path: Path | None = DEFAULT_OUT,
    model: str = DEFAULT_MODEL,
    console: Console | None = None,
    llama_server: Path | None = None,
) -> dict[str, Any]:
    """Runs both comparisons, prints the tables, writes the numbers as JSON to out_path
    (none when it is None). llama_server: the binary, found on its own when None."""
    console = console or Console()
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    with progress(console) as bar:
        results = _run_all(model, sizes, find_llama_server(llama_server), bar)
    goals = _goals(results)
    report: dict[str, Any] = {
        "model": model,
        "quick": quick,
        "sizes": asdict(sizes),
        **results,
        "goals": {g.name: {**asdict(g), "ratio": g.ratio, "met": g.met} for g in goals},
        "elapsed_s": time.perf_counter() - started,
    }
    write_report(out_path, report)
    console.print(sides_table(results))
    console.print(goal_table(goals))
    if out_path is not None:
        console.print(f"Wrote {out_path} in {report['elapsed_s']:.0f} s")
    return report

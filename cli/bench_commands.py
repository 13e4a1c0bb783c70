"""`semgate bench NAME`: each benchmark in bench/, run with --quick and --out alike."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import NamedTuple


class Bench(NamedTuple):
    help: str
    module: str  # in bench/, imported only when it runs (several import torch)
    function: str


BENCHES = {
    "engine": Bench("the engine against Hugging Face transformers", "engine_bench",
                    "run_engine_bench"),
    "spec": Bench("speculative decoding on against off", "spec_bench", "run_spec_bench"),
    "quality": Bench("perplexity and greedy agreement of each weight mode", "quality_bench",
                     "run_quality_bench"),
    "quant": Bench("decode speed of each weight mode against llama.cpp", "quant_bench",
                   "run_quant_bench"),
    "cache": Bench("cache lookup latency and throughput", "cache_bench", "run_cache_bench"),
    "cache-burst": Bench("cache hits and lookup time inside a burst of other requests",
                         "cache_burst_bench", "run_cache_burst_bench"),
    "gateway": Bench("cache-hit latency and miss overhead over HTTP, against in-process",
                     "gateway_bench", "run_gateway_bench"),
    "faults": Bench("/health during huge requests, a killed engine core, SIGTERM mid-stream",
                    "fault_bench", "run_fault_bench"),
    "host-step": Bench("the engine core's host time per decode step, against a baseline",
                       "host_step", "run_host_step_bench"),
    "kv-store": Bench("the Redis KV store: a replica's TTFT on a loaded prompt, saving's cost",
                      "kv_store_bench", "run_kv_store_bench"),
    "pd-threshold": Bench("a remote prefill's cost to its request by prompt length (P/D)",
                          "pd_threshold_bench", "run_pd_threshold_bench"),
}  # fmt: skip
WITH_BASELINE = frozenset({"faults", "host-step"})  # they take --baseline DIR
WITH_ASYNC = frozenset({"engine", "host-step"})  # they take --async-scheduling


def cmd_bench(args: argparse.Namespace) -> int:
    bench = BENCHES[args.bench]
    run = getattr(importlib.import_module(f"bench.{bench.module}"), bench.function)
    extra = {"llama_server": args.llama_server} if args.bench == "quant" else {}
    if args.bench in WITH_BASELINE:
        extra = {"baseline": args.baseline}
    if args.bench in WITH_ASYNC:
        extra["async_scheduling"] = args.async_scheduling
    run(quick=args.quick, out_path=args.out, **extra)
    return 0


def add_bench_commands(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for name, spec in BENCHES.items():
        one = bench_sub.add_parser(name, help=spec.help)
        one.add_argument("--quick", action="store_true", help="a short smoke run")
        one.add_argument(
            "--out", type=Path, default=Path(f"bench-results/{name}.json"), help="JSON report"
        )
        one.set_defaults(func=cmd_bench)
        if name in WITH_BASELINE:
            one.add_argument(
                "--baseline",
                type=Path,
                default=None,
                help="another checkout (say, `git archive main | tar -x -C /tmp/before`) "
                "measured the same way, alternating",
            )
        if name in WITH_ASYNC:
            one.add_argument(
                "--async-scheduling",
                action="store_true",
                help="our engine with async scheduling (docs/engine.md)",
            )
        if name == "quant":
            one.add_argument(
                "--llama-server",
                type=Path,
                default=None,
                help="llama-server binary (default: $LLAMA_SERVER, PATH, .venv/llama.cpp/bin; "
                "scripts/build-llama-server builds one)",
            )

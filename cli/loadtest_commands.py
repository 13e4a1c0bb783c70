"""The `semgate loadtest run|scenario ...` commands.

Only argparse at import: the commands import what they need when they run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from loadtest.pd_scenario import DEFAULT_RATES, DEFAULT_SLO, REQUESTS_PER_RATE
from loadtest.scenarios import SCENARIOS
from loadtest.slo import ITL_STATS
from loadtest.workload import WORKLOADS

if TYPE_CHECKING:
    from loadtest.work_item import WorkloadOptions

DEFAULT_OUT = Path("bench-results/loadtest")


def _add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=None, help="bound on requests sent")
    parser.add_argument("--duration", type=float, default=None, help="bound in seconds")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None, help="open loop: Poisson req/s")
    load.add_argument("--concurrency", type=int, default=None, help="closed loop: in flight")
    parser.add_argument("--max-prompt-tokens", type=int, default=None, help="ShareGPT prompts")
    parser.add_argument(
        "--max-output-tokens", type=int, default=None,
        help="cap on every answer (repeat: an answer cut at it is never cached)",
    )  # fmt: skip
    parser.add_argument(
        "--rag-tokens", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
        help="length range of the rag prompts (default 1024 4096)",
    )  # fmt: skip
    parser.add_argument(
        "--rag-contexts", type=int, default=None,
        help="rag prompts share this many contexts (default 0: one each)",
    )  # fmt: skip
    parser.add_argument(
        "--rag-hot-fraction", type=float, default=None,
        help="draw each rag question's context at random, the first with this probability "
        "(default: the shared contexts in turn)",
    )  # fmt: skip
    parser.add_argument(
        "--long-fraction", type=float, default=None, help="mixed: share of rag prompts (0.2)"
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the request's model")
    parser.add_argument(
        "--tokenizer", default=None, help="counts workload tokens (default: --model)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0, help="of the workload's sampling")


def add_loadtest_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("loadtest", help="load tests and server comparisons over HTTP")
    sub = parser.add_subparsers(dest="loadtest_command", required=True)
    run = sub.add_parser(
        "run", help="drive an OpenAI-compatible endpoint with streaming chat completions"
    )
    run.add_argument("--url", default="http://127.0.0.1:8000", help="server root or its /v1")
    run.add_argument("--workload", choices=WORKLOADS, default="sharegpt", help="prompts to send")
    run.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="Bearer key")
    run.add_argument(
        "--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
        help="send vLLM's ignore_eos so answers are as long as the workload says (not for "
        "repeat, whose answers must end by themselves to be cacheable)",
    )  # fmt: skip
    run.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT / "run", help="report directory")
    _add_workload_arguments(run)
    run.set_defaults(func=cmd_run)

    scenario = sub.add_parser(
        "scenario",
        help="start two servers (or two gateways and their engine servers) and compare them "
        "on one workload",
    )
    scenario.add_argument(
        "name", choices=sorted([*SCENARIOS, "pd"]), help="what the two servers differ in"
    )
    scenario.add_argument("--rounds", type=int, default=None, help="alternating rounds (2)")
    scenario.add_argument(
        "--num-threads", type=int, default=1, help="engine CPU threads of each server"
    )
    scenario.add_argument(
        "--out", type=Path, default=None,
        help=f"default {DEFAULT_OUT}/NAME (a scenario run next: beside it, by its name)",
    )  # fmt: skip
    _add_workload_arguments(scenario)
    _add_pd_arguments(scenario)
    scenario.set_defaults(func=cmd_scenario)


def _add_pd_arguments(scenario: argparse.ArgumentParser) -> None:
    pd = scenario.add_argument_group(
        "pd", f"a sweep of --rates, --num-requests at each ({REQUESTS_PER_RATE}), judged by SLOs"
    )
    pd.add_argument(
        "--rates", type=float, nargs="+", default=None, metavar="RATE",
        help=f"Poisson request rates swept, req/s (default {' '.join(map(str, DEFAULT_RATES))})",
    )  # fmt: skip
    for what, default in (("ttft", DEFAULT_SLO.ttft_ms), ("itl", DEFAULT_SLO.itl_ms)):
        pd.add_argument(
            f"--slo-{what}-ms", type=float, default=default, help=f"{what.upper()} SLO of a request"
        )
    pd.add_argument(
        "--slo-itl",
        choices=ITL_STATS,
        default=DEFAULT_SLO.itl_stat,
        help="a request's ITL: the mean of its inter-token gaps (vLLM's TPOT) or their p90",
    )
    pd.add_argument(
        "--results",
        type=Path,
        default=None,
        help="judge an earlier pd run's results.json against these SLOs instead of running",
    )
    pd.add_argument(
        "--kill-store-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a fault: kill each side's KV store (SIGKILL) this long into the sweep; every "
        "request must still be answered",
    )


def _workload_options(args: argparse.Namespace, defaults: dict[str, object]) -> WorkloadOptions:
    from loadtest.work_item import WorkloadOptions

    flags = {
        "num_requests": args.num_requests,
        "max_prompt_tokens": args.max_prompt_tokens,
        "max_output_tokens": args.max_output_tokens,
        "rag_tokens": tuple(args.rag_tokens) if args.rag_tokens else None,
        "rag_contexts": args.rag_contexts,
        "rag_hot_fraction": args.rag_hot_fraction,
        "long_fraction": args.long_fraction,
        "tokenizer": args.tokenizer or args.model,
        "seed": args.seed,
    }
    given = {key: value for key, value in flags.items() if value is not None}
    return WorkloadOptions(**{**defaults, **given})


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadtest.client import Endpoint
    from loadtest.load import LoadTest, run_load_test
    from loadtest.runner import LoadShape

    console = Console(stderr=True)
    test = LoadTest(
        workload=args.workload,
        options=_workload_options(args, {"num_requests": 50}),
        endpoint=Endpoint(
            Endpoint.chat_url(args.url),
            args.model,
            api_key=args.api_key,
            ignore_eos=args.ignore_eos,
            temperature=args.temperature,
            timeout=args.timeout,
        ),
        shape=LoadShape(
            # --rate and --concurrency exclude each other; neither: 1 req/s open loop
            rate=1.0 if args.rate is None and args.concurrency is None else args.rate,
            concurrency=args.concurrency,
            duration=args.duration or 600.0,
            seed=args.seed,
        ),
    )
    _, report = run_load_test(test, args.out, console)
    console.print(f"report: {report}")
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadtest.compare import ScenarioRun, run_scenario
    from loadtest.runner import LoadShape

    _check_scenario_flags(args)
    if args.name == "pd":
        return _pd(args)
    console = Console(stderr=True)
    out = args.out or DEFAULT_OUT / args.name
    name: str | None = args.name
    while name is not None:  # the scenario, then those it says to run next
        scenario = SCENARIOS[name]
        run = ScenarioRun(
            scenario, rounds=args.rounds or 2, num_threads=args.num_threads, timeout=args.timeout,
            model=args.model, seed=args.seed,
        )  # fmt: skip
        options = _workload_options(
            args, {"num_requests": scenario.num_requests, **scenario.options}
        )
        closed = args.concurrency is not None or (args.rate is None and scenario.rate is None)
        shape = LoadShape(
            rate=None if closed else (args.rate or scenario.rate),
            concurrency=(args.concurrency or scenario.concurrency) if closed else None,
            duration=args.duration or 900.0,
            seed=args.seed,
        )
        report = run_scenario(run, options, shape, out, console)
        console.print(f"report: {report}")
        name = scenario.then
        out = out.parent / (name or "")
    return 0


def _check_scenario_flags(args: argparse.Namespace) -> None:
    """The pd sweep sets its own load; the other scenarios have no sweep and no SLOs."""
    if args.name == "pd":
        given = {
            "--rate": args.rate, "--concurrency": args.concurrency,
            "--duration": args.duration, "--rounds": args.rounds,
        }  # fmt: skip
        what = "sweeps --rates, each until its requests are answered"
    else:
        slo_given = (args.slo_ttft_ms, args.slo_itl_ms, args.slo_itl) != (
            DEFAULT_SLO.ttft_ms, DEFAULT_SLO.itl_ms, DEFAULT_SLO.itl_stat,
        )  # fmt: skip
        given = {
            "--rates": args.rates, "--results": args.results, "--slo-*": slo_given or None,
            "--kill-store-after": args.kill_store_after,
        }  # fmt: skip
        what = "runs at one load, with no SLOs"
    if flags := [flag for flag, value in given.items() if value is not None]:
        raise ValueError(f"scenario {args.name} {what}: {', '.join(flags)} do not apply")


def _pd(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadtest.pd_scenario import ABOUT, PD_OPTIONS, SweepRun
    from loadtest.slo import Slo
    from loadtest.sweep import run_sweep
    from loadtest.sweep_report import (
        headline_text,
        load_result,
        rates_table,
        write_sweep_report,
    )

    console = Console(stderr=True)
    slo = Slo(args.slo_ttft_ms, args.slo_itl_ms, args.slo_itl)
    if args.results is not None:
        result, about = load_result(args.results)
    else:
        run = SweepRun(
            rates=tuple(args.rates or DEFAULT_RATES), num_threads=args.num_threads,
            timeout=args.timeout, model=args.model, seed=args.seed,
            kill_store_after=args.kill_store_after,
        )  # fmt: skip
        options = _workload_options(args, {"num_requests": REQUESTS_PER_RATE, **PD_OPTIONS})
        result, about = run_sweep(run, options, console), ABOUT
    report, summary = write_sweep_report(args.out or DEFAULT_OUT / "pd", result, slo, about)
    console.print(rates_table(summary))
    console.print(headline_text(summary).replace("**", ""))
    console.print(f"report: {report}")
    return 0

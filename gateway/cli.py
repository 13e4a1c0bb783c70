"""The `semgate` command line: serve the gateway, chat with the bundled model, run benchmarks."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from gateway.cache_cli import add_cache_commands
from gateway.cli_parser import Parser
from gateway.serve_cli import QUANTIZATION_CHOICES, add_serve_command

console = Console(stderr=True)
REPL_HELP = (
    "/reset forgets the conversation, /help shows this, /quit (or an empty line, Ctrl-D) ends"
)


def _engine_config(args: argparse.Namespace) -> Any:
    from engine import EngineConfig

    return EngineConfig(
        model=args.model, max_model_len=args.max_model_len, quantization=args.quantization
    )


def _stream_answer(llm: Any, messages: list[dict[str, str]], params: Any) -> str:
    """Runs one chat turn, printing text as it is generated; returns the answer."""
    engine = llm.engine
    request_id = engine.add_request(llm.tokenizer.apply_chat_template(messages), params)
    answer, finish_reason = "", None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == request_id:
                sys.stdout.write(out.delta_text)
                sys.stdout.flush()
                answer += out.delta_text
                finish_reason = out.finish_reason
    sys.stdout.write("\n")
    if finish_reason == "length":
        console.print(f"[yellow](cut at --max-tokens {params.max_tokens})[/yellow]")
    return answer


def _version() -> str:
    try:
        return importlib.metadata.version("semgate")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def cmd_chat(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams

    with console.status(f"loading {args.model} ..."):
        llm = LLM(_engine_config(args))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    if args.prompt:
        _stream_answer(llm, [*history, {"role": "user", "content": " ".join(args.prompt)}], params)
        return 0
    if not sys.stdin.isatty():
        console.print("[red]no prompt given and standard input is not a terminal[/red]")
        console.print('usage: semgate chat "your question"   (or run it on a terminal for a REPL)')
        return 2
    console.print(f"[bold]semgate chat[/bold]: {REPL_HELP}")
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            break
        if not line or line == "/quit":
            break
        if line == "/help":
            console.print(REPL_HELP)
            continue
        if line == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = _stream_answer(llm, history, params)
        except ValueError as exc:  # e.g. the conversation outgrew the context
            console.print(f"[red]{escape(str(exc))}[/red]")
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from engine.bench import run_engine_bench

    run_engine_bench(quick=args.quick, out_path=args.out)
    return 0


def cmd_bench_spec(args: argparse.Namespace) -> int:
    from engine.bench.spec_bench import run_spec_bench

    run_spec_bench(quick=args.quick, out_path=args.out)
    return 0


def cmd_bench_quality(args: argparse.Namespace) -> int:
    from engine.bench.quality_bench import run_quality_bench

    run_quality_bench(quick=args.quick, out_path=args.out)
    return 0


def cmd_bench_quant(args: argparse.Namespace) -> int:
    from engine.bench.quant_bench import run_quant_bench

    run_quant_bench(quick=args.quick, out_path=args.out, llama_server=args.llama_server)
    return 0


def cmd_bench_cache(args: argparse.Namespace) -> int:
    from gateway.cache_bench import run_cache_bench

    run_cache_bench(quick=args.quick, out_path=args.out)
    return 0


def cmd_bench_gateway(args: argparse.Namespace) -> int:
    from gateway.gateway_bench import run_gateway_bench

    run_gateway_bench(quick=args.quick, out_path=args.out)
    return 0


def cmd_loadtest(args: argparse.Namespace) -> int:
    return args.loadtest_func(args)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="semgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine details")
    parser.add_argument("--version", action="version", version=f"semgate {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser("chat", help="chat with the model in the terminal")
    chat.add_argument("prompt", nargs="*", help="one prompt to answer; none opens a REPL")
    chat.add_argument(
        "--model", default="smollm2-135m-instruct", help="bundled name, .gguf file or HF dir"
    )
    chat.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's)"
    )
    chat.add_argument(
        "--quantization", choices=QUANTIZATION_CHOICES, default="auto", help="weights on CPU"
    )
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=512, help="longest answer, in tokens")
    chat.add_argument("--temperature", type=float, default=0.7, help="0: greedy")
    chat.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling")
    chat.add_argument("--seed", type=int, default=None, help="for reproducible answers")
    chat.set_defaults(func=cmd_chat)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    benches = [
        ("engine", "the engine against Hugging Face transformers", cmd_bench_engine),
        ("spec", "speculative decoding on against off", cmd_bench_spec),
        ("quality", "perplexity and greedy agreement of each weight mode", cmd_bench_quality),
        ("quant", "decode speed of each weight mode against llama.cpp", cmd_bench_quant),
        ("cache", "cache lookup latency and throughput", cmd_bench_cache),
        (
            "gateway",
            "cache-hit latency and miss overhead over HTTP, against in-process",
            cmd_bench_gateway,
        ),
    ]
    for name, help_text, func in benches:
        one = bench_sub.add_parser(name, help=help_text)
        one.add_argument("--quick", action="store_true", help="a short smoke run")
        one.add_argument(
            "--out", type=Path, default=Path(f"bench-results/{name}.json"), help="JSON report"
        )
        one.set_defaults(func=func)
        if name == "quant":
            one.add_argument(
                "--llama-server",
                type=Path,
                default=None,
                help="llama-server binary (default: $LLAMA_SERVER, PATH, .venv/llama.cpp/bin; "
                "scripts/build-llama-server builds one)",
            )
    add_cache_commands(sub)
    add_serve_command(sub)
    from loadtest.cli import add_subcommands as add_loadtest_commands  # argparse only

    loadtest = sub.add_parser("loadtest", help="load tests and server comparisons over HTTP")
    add_loadtest_commands(loadtest)
    loadtest.set_defaults(func=cmd_loadtest)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Loading the embedder through transformers prints progress bars and notes that
    # concern training, not serving.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `semgate`
        parser.print_help()
        return 0
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except (ValueError, RuntimeError, TimeoutError) as exc:  # incl. RedisUnavailableError
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

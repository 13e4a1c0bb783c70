"""The `semgate` command line: serve the gateway, chat with the bundled model, run benchmarks."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys

from rich.console import Console
from rich.markup import escape

from cli.bench_commands import add_bench_commands
from cli.cache_commands import add_cache_commands
from cli.chat_command import add_chat_command
from cli.loadtest_commands import add_loadtest_command
from cli.parser import Parser
from cli.serve_command import add_serve_command

console = Console(stderr=True)


def _version() -> str:
    try:
        return importlib.metadata.version("semgate")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="semgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine details")
    parser.add_argument("--version", action="version", version=f"semgate {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    add_chat_command(sub)
    add_bench_commands(sub)
    add_cache_commands(sub)
    add_serve_command(sub)
    add_loadtest_command(sub)
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

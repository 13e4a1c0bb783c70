"""`semgate chat`: the bundled model in the terminal, one prompt or a REPL, no server."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

from cli.engine_flags import add_engine_flags

console = Console(stderr=True)
ENGINE_FLAGS = ("model", "max_model_len", "quantization")  # the engine flags chat takes

REPL_HELP = (
    "/reset forgets the conversation, /help shows this, /quit (or an empty line, Ctrl-D) ends"
)


def _engine_config(args: argparse.Namespace) -> Any:
    from engine import EngineConfig

    given = {name: getattr(args, name) for name in ENGINE_FLAGS}
    return EngineConfig(**{name: value for name, value in given.items() if value is not None})


def _stream_answer(llm: Any, messages: list[dict[str, str]], params: Any) -> str:
    """Runs one chat turn, printing text as it is generated; returns the answer."""
    request_id = llm.add_request(llm.tokenizer.apply_chat_template(messages), params)
    answer, finish_reason = "", None
    while llm.has_unfinished():
        for out in llm.step():
            if out.request_id == request_id:
                sys.stdout.write(out.delta_text)
                sys.stdout.flush()
                answer += out.delta_text
                finish_reason = out.finish_reason
    sys.stdout.write("\n")
    if finish_reason == "length":
        console.print(f"[yellow](cut at --max-tokens {params.max_tokens})[/yellow]")
    return answer


def cmd_chat(args: argparse.Namespace) -> int:
    if not args.prompt and not sys.stdin.isatty():  # refused before the model loads
        console.print("[red]no prompt given and standard input is not a terminal[/red]")
        console.print('usage: semgate chat "your question"   (or run it on a terminal for a REPL)')
        return 2
    from engine import LLM, SamplingParams

    config = _engine_config(args)
    with console.status(f"loading {config.model} ..."):
        llm = LLM(config)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    if args.prompt:
        _stream_answer(llm, [*history, {"role": "user", "content": " ".join(args.prompt)}], params)
        return 0
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


def add_chat_command(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser("chat", help="chat with the model in the terminal")
    chat.add_argument("prompt", nargs="*", help="one prompt to answer; none opens a REPL")
    add_engine_flags(chat, ENGINE_FLAGS)
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=512, help="longest answer, in tokens")
    chat.add_argument("--temperature", type=float, default=0.7, help="0: greedy")
    chat.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling")
    chat.add_argument("--seed", type=int, default=None, help="for reproducible answers")
    chat.set_defaults(func=cmd_chat)

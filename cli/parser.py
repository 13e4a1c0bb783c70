"""argparse set up once for every `semgate` command: each option's default in its help,
and each subcommand's one-line help as its description too."""

from __future__ import annotations

import argparse
from typing import Any


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (a precision, a similarity), refused at once
    rather than after minutes of measuring."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default wherever one is set. Options whose default is None (the serve
    flags, which the settings file and environment may also set) or a switch's False
    say their default in their own help text instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class _SubParsers(argparse._SubParsersAction):
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if "help" in kwargs:
            kwargs.setdefault("description", kwargs["help"])
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """The parser of `semgate` and, through its subparsers, of every subcommand."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)

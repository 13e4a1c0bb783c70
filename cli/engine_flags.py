"""The engine's flags, made from its declared settings (engine/options.py) and the
gateway's own for its engine (gateway/engine_settings.py): `max_num_seqs` is
`--max-num-seqs`, a switch is `--[no-]chunked-prefill`. Each defaults to None (not
given), so that a settings file or SEMGATE_* may set it; its help says the declared
default. No torch: `--help` loads none."""

from __future__ import annotations

import argparse
from collections.abc import Collection
from dataclasses import Field, fields
from typing import Any, get_args, get_type_hints

from cli.parser import fraction
from engine.options import default_in_words, option_of
from gateway.engine_settings import EngineSettings


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def value_type(setting: Field[Any]) -> type:
    """The setting's type without None (`int | None`: int)."""
    hint = get_type_hints(EngineSettings)[setting.name]
    return next(kind for kind in get_args(hint) or (hint,) if kind is not type(None))


def add_engine_flags(parser: argparse.ArgumentParser, names: Collection[str] | None = None) -> None:
    """A flag for each engine setting, or for those in `names`."""
    for setting in fields(EngineSettings):
        if names is not None and setting.name not in names:
            continue
        option, kind = option_of(setting), value_type(setting)
        spelling: dict[str, Any] = {"choices": option.choices or None}
        if kind is bool:
            spelling = {"action": argparse.BooleanOptionalAction}
        elif kind is not str:
            spelling["type"] = fraction if option.share else kind
        parser.add_argument(
            flag_name(setting.name),
            default=None,
            help=f"{option.help} (default: {default_in_words(setting)})",
            **spelling,
        )

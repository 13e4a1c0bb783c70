"""The table of the in-process engine's settings in docs/gateway.md, made from their
declaration (engine/options.py, gateway/engine_settings.py) as the flags are.
`python -m cli.settings_table` rewrites it in place; a test checks that it is current."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from cli.engine_flags import flag_name, value_type
from engine.options import default_in_words, option_of
from gateway.engine_settings import EngineSettings
from gateway.settings import env_variable

DOC = Path(__file__).parents[1] / "docs" / "gateway.md"
BEGIN = "<!-- engine settings: written by `python -m cli.settings_table` -->\n"
END = "<!-- end of engine settings -->\n"


def settings_table() -> str:
    """One markdown row a setting: its name, flag, environment variable, default, help."""
    rows = ["| setting | flag | environment | default | meaning |", "|---|---|---|---|---|"]
    for setting in fields(EngineSettings):
        option, name = option_of(setting), setting.name
        flag, variable = flag_name(name), env_variable(name)
        if value_type(setting) is bool:
            flag = flag.replace("--", "--[no-]", 1)
            variable += "=0" if setting.default else "=1"
        elif option.choices:
            flag += " " + "\\|".join(option.choices)
        default = default_in_words(setting)
        rows.append(f"| {name} | `{flag}` | `{variable}` | {default} | {option.help} |")
    return "\n".join(rows) + "\n"


def with_current_table(text: str) -> str:
    """The page with the table between BEGIN and END made anew."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC} lacks the lines {BEGIN.strip()} and {END.strip()}")
    return f"{head}{BEGIN}\n{settings_table()}\n{END}{tail}"


if __name__ == "__main__":
    DOC.write_text(with_current_table(DOC.read_text()))

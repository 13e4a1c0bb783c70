"""The engine's settings table in docs/gateway.md is the one their declaration makes."""

from __future__ import annotations

from cli.settings_table import DOC, with_current_table


def test_the_docs_table_is_made_from_the_declaration():
    text = DOC.read_text()
    assert with_current_table(text) == text, "run `python -m cli.settings_table`"

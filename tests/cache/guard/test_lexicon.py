"""The guard's word lists (cache/guard/guard_words.json): each says what it is for, and each is
read."""

from __future__ import annotations

import json
from pathlib import Path

from cache.guard import lexicon

WORDS = Path(lexicon.__file__).with_name("guard_words.json")
LISTS: dict[str, dict] = json.loads(WORDS.read_text(encoding="utf-8"))
SHAPES = {"words", "map", "pairs", "groups", "named_groups"}


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_each_list_has_a_description_an_example_and_one_shape():
    for name, entry in LISTS.items():
        assert entry["description"] and entry["example"], name
        shape = entry.keys() - {"description", "example"}
        assert len(shape) == 1 and shape <= SHAPES, name


def test_words_are_lower_case_and_listed_once():
    # Questions are compared lower-cased: a word with a capital would never match.
    for name, entry in LISTS.items():
        content = {k: v for k, v in entry.items() if k in SHAPES}
        assert all(s == s.lower() for s in _strings(content)), name
        if "words" in entry:
            assert len(entry["words"]) == len(set(entry["words"])), name


def test_every_list_is_read():
    loader = Path(lexicon.__file__).read_text(encoding="utf-8")
    assert [name for name in LISTS if f'"{name}"' not in loader] == []

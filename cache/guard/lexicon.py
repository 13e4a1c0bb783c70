"""The guard's vocabulary, read from `guard_words.json`, where each list says what it is
for and gives an example. A list there is one of: "words", "map" (a word to its value),
"pairs", "groups" or "named_groups" (a name to a group's words). Held here as frozensets
and dicts, so a lookup costs what a literal's would."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

_LISTS: dict[str, dict[str, Any]] = json.loads(
    files("cache.guard").joinpath("guard_words.json").read_text(encoding="utf-8")
)


def _words(name: str) -> list[str]:
    return list(_LISTS[name]["words"])


def _word_set(name: str) -> frozenset[str]:
    return frozenset(_LISTS[name]["words"])


def _map(name: str) -> dict[str, Any]:
    return dict(_LISTS[name]["map"])


def _word_map(name: str) -> dict[str, str]:
    """A map of a word to a word (an alias to its name, a particle to its opposite)."""
    return dict(_LISTS[name]["map"])


def _pairs(name: str) -> list[tuple[str, str]]:
    return [(x, y) for x, y in _LISTS[name]["pairs"]]


def _groups(name: str) -> list[set[str]]:
    return [set(group) for group in _LISTS[name]["groups"]]


def _named_groups(name: str) -> dict[str, list[str]]:
    return dict(_LISTS[name]["named_groups"])


def _union(name: str) -> frozenset[str]:
    return frozenset(word for group in _named_groups(name).values() for word in group)


# Numbers: the ones, tens and ordinals are listed in order, so a word's place is its value.
_ONES, _TENS, _ORDINALS = _words("ones"), _words("tens"), _words("ordinals")
TENS_WORDS = frozenset(_TENS)
CARDINAL_WORDS = frozenset(_ONES + _TENS)
MULTIPLIER_WORDS = _word_set("multipliers")
NUMBER_WORDS: dict[str, float] = {
    **{w: float(i) for i, w in enumerate(_ONES, 1)},
    **{w: float(20 + 10 * i) for i, w in enumerate(_TENS)},
    **{w: float(i) for i, w in enumerate(_ORDINALS, 2)},
    **{w: float(value) for w, value in _map("number_words").items()},
}

# Units and times.
_UNIT_GROUPS: dict[str, list[str]] = _map("units")
UNITS: dict[str, str] = {alias: unit for unit, aliases in _UNIT_GROUPS.items() for alias in aliases}
UNIT_NAMES = frozenset(_UNIT_GROUPS)
LETTER_UNITS = _word_map("letter_units")
CURRENCY_SIGNS = _word_set("currency_signs")
CURRENCY_UNITS = _word_set("currency_units")
TEMPERATURE_UNITS = _word_set("temperature_units")
LARGER_TIME_UNITS: dict[str, list[tuple[int, str]]] = {
    unit: [(size, larger) for size, larger in ladder]
    for unit, ladder in _map("larger_time_units").items()
}
TIME_UNIT_NAMES = _word_set("time_unit_names")
ASKING_WORDS = _word_set("asking_words")
ORDINAL_UNIT_WORDS = _word_set("ordinal_unit_words")
PER_WORDS = _word_set("per_words")
TEMPORAL_PREPOSITIONS = _word_map("temporal_prepositions")
TIME_ORDINALS = _word_set("time_ordinals")

# Negation, opposites, alternatives, synonyms.
NEGATIONS = _word_set("negations")
IMPLIED_NEGATIVES = _word_set("implied_negatives")
LOSS_VERBS = _word_set("loss_verbs")
ANTONYM_PAIRS = _pairs("antonym_pairs")
OPPOSITE_PARTICLES = _word_map("opposite_particles")
_AUDIENCES = _named_groups("audience_groups")
_AUDIENCE_ALTERNATIVES = _named_groups("audience_alternatives")
AUDIENCE_GROUPS: list[set[str]] = [set(group) for group in _AUDIENCES.values()]
# An audience group is a set of alternatives too, with the words that are its
# alternatives without being an audience ("adult" is the default one).
CONTRAST_GROUPS: list[set[str]] = [
    *(set(group) | set(_AUDIENCE_ALTERNATIVES[name]) for name, group in _AUDIENCES.items()),
    *(set(group) for group in _named_groups("contrast_groups").values()),
]
SYNONYM_GROUPS = _groups("synonym_groups")

# Names.
GAZETTEER = _union("gazetteer")
ENTITY_ALIASES = _word_map("entity_aliases")
ENTITY_PARENTS: dict[str, str] = {
    kind: parent for parent, kinds in _named_groups("entity_parents").items() for kind in kinds
}
NOT_ENTITIES = _word_set("not_entities")
ACRONYM_SKIPPED = _word_set("acronym_skipped")

# Function words, and the words that give a phrase a direction or a role.
STOPWORDS = _union("stopwords")
ARTICLES = _word_set("articles")
SYMMETRIC = _word_set("symmetric")
GENITIVE_WORDS = _word_set("genitive_words")
DIRECTION_WORDS = _word_set("direction_words")
DIRECTIONAL_TO = _word_set("directional_to")
MOTION_WORDS = _word_set("motion_words")
NONCOMMUTATIVE = _word_set("noncommutative")
CLAUSE_BREAKS = _word_set("clause_breaks")
COMPARATIVE_WORDS = _word_set("comparative_words")
DOING_AUXILIARIES = _word_set("doing_auxiliaries")

# Modifiers and qualifiers.
NON_NARROWING = _word_set("non_narrowing")
QUALIFIER_OPENERS = _word_set("qualifier_openers")
QUESTION_WORDS = _word_set("question_words")

# Question types; the ordered lists are alternatives in `question_types.QUESTION_TYPES`.
CUE_OPENERS = _word_set("cue_openers")
POLAR_AUXILIARIES = _word_set("polar_auxiliaries")
REQUEST_AUXILIARIES = _word_set("request_auxiliaries")
DO_AUXILIARIES = _word_set("do_auxiliaries")
GREETINGS = _word_set("greetings")
PRICE_WORDS = _word_set("price_words")
COMPATIBLE_QUESTION_TYPES = frozenset(
    frozenset(pair) for pair in _pairs("compatible_question_types")
)
ASKED_TIME_UNITS = _words("asked_time_units")
ASKED_LENGTH_UNITS = _words("asked_length_units")
DURATION_NOUNS = _words("duration_nouns")
AGENT_NOUNS = _words("agent_nouns")
ANSWER_TYPE_NOUNS = _word_set("answer_type_nouns") | frozenset(AGENT_NOUNS)

"""The quantities a question states: each number with its unit, the units it names,
spans of time in their largest whole unit, and whether it asks before, during or after
a stated time."""

from __future__ import annotations

from cache.guard import lexicon
from cache.guard.words import number_value


def measures(words: list[str]) -> list[tuple[float, str | None]]:
    """Each number in order, with the unit that follows it ("30 years", "6 %"), if any.
    Currencies count as no unit: a sign is often left out ("$300k" vs "300k")."""
    values: list[tuple[float, str | None]] = []
    previous_tens = previous_number = False
    for i, word in enumerate(words):
        value = 1.0 if word == "k" else number_value(word)
        if word in lexicon.ORDINAL_UNIT_WORDS and i and words[i - 1] in lexicon.PER_WORDS:
            value = None  # "per second" is a unit, not the ordinal
        if value is None:
            previous_tens = previous_number = False
            continue
        following = words[i + 1 : i + 3]
        units = [lexicon.UNITS[w] for w in following if w in lexicon.UNITS]
        if following and not units and following[0] in lexicon.LETTER_UNITS:
            units = [lexicon.LETTER_UNITS[following[0]]]
        unit = units[0] if units and units[0] not in lexicon.CURRENCY_UNITS else None
        # "15% of 80" is an operation on its numbers, not a rate like "at 6% for 30 years".
        if unit == "percent" and "of" in words[i + 2 : i + 4]:
            unit = None
        if word == "k" and previous_number and values:
            values[-1] = (values[-1][0] * 1000, unit)  # "300k", "401(k)"
        elif word in lexicon.MULTIPLIER_WORDS and values:
            values[-1] = (values[-1][0] * value, unit)  # "two hundred", "5 million"
        elif previous_tens and value < 10:
            values[-1] = (values[-1][0] + value, unit)  # "twenty five"
        else:
            values.append((value, unit))
        previous_tens = word in lexicon.TENS_WORDS
        previous_number = True
    # One is the unit quantity: "1 lb" and "a pound" ask the same thing.
    return [(v, u) for v, u in values if v != 1.0]


def whole_time_spans(words: list[str]) -> list[str]:
    """Each span of time in the largest unit it fills whole: "a 14-day trip" and "a two
    week trip" ask the same, as do "the first 12 months" and "the first year" (a lone 1
    is then the unit quantity, see `measures`). Rates stay ("7 days a week" is always
    open, not one week), and so do ordinals ("the 14th day") and compound numbers."""
    spans = list(words)
    for i in range(len(words) - 1):
        word, unit_word = words[i], words[i + 1]
        unit = lexicon.UNITS.get(unit_word)
        if unit not in lexicon.LARGER_TIME_UNITS or unit_word.endswith("ly"):
            continue
        cardinal = word.isdigit() or word in lexicon.CARDINAL_WORDS
        compound = i > 0 and number_value(words[i - 1]) is not None
        rate = i + 2 < len(words) and words[i + 2] in lexicon.PER_WORDS
        if cardinal and not compound and not rate:
            value, larger = _larger_span(int(number_value(word) or 0), unit)
            if larger != unit:
                spans[i : i + 2] = [str(value), larger]
    return spans


def _larger_span(value: int, unit: str) -> tuple[int, str]:
    """`value` `unit`s in the largest unit they fill whole; the ladder only climbs, so
    this ends."""
    if value == 0:
        return value, unit
    for size, larger in lexicon.LARGER_TIME_UNITS.get(unit, []):
        if value % size == 0:
            return _larger_span(value // size, larger)
    return value, unit


def units_in(words: list[str]) -> tuple[list[str], set[str]]:
    """All units in order, and those that measure a stated number ("30 days")."""
    units: list[str] = []
    quantified: set[str] = set()
    numeric = [number_value(w) is not None for w in words] + [False]
    for i, word in enumerate(words):
        after_number = i > 0 and numeric[i - 1]
        # "100 us dollars": one word may sit between a number and its unit, though not
        # another unit ("20k miles annually" measures miles).
        near_number = after_number or (
            i > 1 and numeric[i - 2] and words[i - 1] not in lexicon.UNITS
        )
        unit = lexicon.UNITS.get(word)
        # Bare letters (c, f, m, g, l, h, s) are units only right after a number.
        if unit is None and word in lexicon.LETTER_UNITS and after_number:
            unit = lexicon.LETTER_UNITS[word]
        if unit is not None:
            units.append(unit)
            if near_number or (word in lexicon.CURRENCY_SIGNS and numeric[i + 1]):
                quantified.add(unit)  # "30 days", "$20"
    return units, quantified


def timing(words: list[str]) -> set[str]:
    """Whether a question asks before, during or after a stated time: a temporal
    preposition shortly before a number, an ordinal or a time unit ("in the first 48
    hours" vs "after the first 48 hours", "within 30 days" vs "after 30 days")."""
    found: set[str] = set()
    for i, word in enumerate(words):
        relation = lexicon.TEMPORAL_PREPOSITIONS.get(word)
        ahead = words[i + 1 : i + 4]
        if relation is None or (word == "in" and ahead and number_value(ahead[0]) is not None):
            continue
        if any(
            lexicon.UNITS.get(w) in lexicon.TIME_UNIT_NAMES
            or number_value(w) is not None
            or w in lexicon.TIME_ORDINALS
            for w in ahead
        ):
            found.add(relation)
    return found

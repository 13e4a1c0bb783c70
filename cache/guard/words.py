"""A question's words as the guard reads them: tokens (numbers, units, operators,
names such as node.js or c++), each number's value, a crude stem, and negation words."""

from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache

from cache.guard import lexicon

_TOKEN = re.compile(
    r"°\s?[cfk]\b"  # degree units
    r"|[$€£¥₹%]"  # currency signs (lexicon.CURRENCY_SIGNS) and percent
    r"|\d+/\d+"  # fractions
    r"|[=!<>]==?|&&|\|\||[-=]>|[+\-*/%]=|\+\+|--(?!\w)"  # operators: === vs ==, != ...
    r"|\d+(?:[.,]\d+)*(?:st|nd|rd|th|k)?(?![^\W_])"  # numbers, ordinals, 300k
    r"|[^\W\d_]+\d+[^\W\d_]+(?![^\W_])"  # numeronyms: k8s, i18n (no number in them)
    r"|[^\W\d_]+(?:[.'\u2019+#-][^\W\d_0-9]+)*[+#]*"  # words: node.js, c++, c#, don't, e-mail
    r"|[^\W_]+"  # alphanumerics: python3, gpt4, 5g
    r"|[-+*/^]",  # arithmetic, kept only between numbers or variables (see tokenize)
    re.UNICODE | re.IGNORECASE,
)
_ARITHMETIC = frozenset("-+*/^")
_WITHOUT = re.compile(r"\bw/o\b", re.IGNORECASE)
_NUMERIC = re.compile(r"^\d+(?:[.,]\d+)*(?:st|nd|rd|th|k)?$")
_NUMBER_WITH_UNIT = re.compile(r"^(\d+(?:\.\d+)?)([a-z]+)$")


def stem(word: str) -> str:
    """A crude suffix stripper: enough to match increase/increases/increasing."""
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


# Asked ~60 times a text (units, entities, direction anchors), mostly about the same
# common words: cached, a new question's features take ~0.12 ms instead of ~0.15 ms.
@lru_cache(maxsize=16384)
def number_value(token: str) -> float | None:
    if re.fullmatch(r"\d+/\d+", token):
        num, den = (int(part) for part in token.split("/"))
        # A fraction in lowest terms is a quantity ("3/4 cup" = "0.75 cups"); one that is
        # not is a notation (a 6/8 time signature, 20/20 vision), a word that only its own
        # digits match.
        return num / den if den and math.gcd(num, den) == 1 else None
    if _NUMERIC.match(token):
        scale = 1000.0 if token.endswith("k") else 1.0
        digits = re.sub(r"(st|nd|rd|th|k)$", "", token)
        # "1,000" is a thousand; "1,5" (a European decimal) is 1.5.
        if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", digits):
            digits = digits.replace(",", "")
        parts = digits.replace(",", ".").split(".")
        if len(parts) > 2:
            # A version or an address (3.10.1, 192.168.1.1): one value per whole token,
            # distinct for distinct tokens (3.010001 vs 3.010002), so they compare exactly.
            return sum(int(p) * 1000.0**-i for i, p in enumerate(parts)) * scale
        return float(".".join(parts)) * scale
    return lexicon.NUMBER_WORDS.get(token)


def strip_possessive(word: str) -> str:
    return word[:-2] if word.endswith("'s") and len(word) > 3 else word


def tokenize(text: str) -> list[tuple[str, str]]:
    """(original, lower-case) tokens; curly apostrophes normalised, dashes that are no
    arithmetic and "degrees" before its scale left out."""
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'")
    text = _WITHOUT.sub("without", text)
    tokens: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(text):
        original = match.group()
        lower = original.lower().replace(" ", "")
        glued = _NUMBER_WITH_UNIT.match(lower)  # "100g" -> "100", "g"; "2fa" stays a name
        parts = lower.split("-")
        if glued and (glued[2] in lexicon.UNITS or glued[2] in lexicon.LETTER_UNITS):
            tokens += [(glued[1], glued[1]), (glued[2], glued[2])]
        elif len(parts) > 1 and (
            any(part in lexicon.UNITS for part in parts)
            or all(part in lexicon.NUMBER_WORDS for part in parts)
        ):
            # "10-week-old": week, old; "twenty-five": 25 ("two-factor" stays a word, as
            # "2fa" is one).
            tokens += [(part, part) for part in parts if part]
        else:
            tokens.append((original, lower))
    return [
        t
        for i, t in enumerate(tokens)
        if (t[1] not in _ARITHMETIC or _operands(tokens, i)) and not _scale_follows(tokens, i)
    ]


def _scale_follows(tokens: list[tuple[str, str]], i: int) -> bool:
    """Whether tokens[i] is "degrees" before the scale it is in: dropped, "350 degrees
    Fahrenheit" measures in Fahrenheit as "350 °F" does (a bare "degrees" stands for
    whichever scale the other question names, see `comparable_units`)."""
    following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
    return (
        lexicon.UNITS.get(tokens[i][1]) == "degree"
        and lexicon.UNITS.get(following) in lexicon.TEMPERATURE_UNITS
    )


def _operands(tokens: list[tuple[str, str]], i: int) -> bool:
    """Whether the tokens either side of tokens[i] are numbers or variables ("3x + 7",
    "2 ^ 10"): then it is arithmetic, else a dash ("5 cm - how do I ...")."""

    def math_like(token: str) -> bool:
        return any(c.isdigit() for c in token) or (len(token) == 1 and token.isalpha())

    return 0 < i < len(tokens) - 1 and math_like(tokens[i - 1][1]) and math_like(tokens[i + 1][1])


def is_negation(word: str) -> bool:
    return word in lexicon.NEGATIONS or word.endswith("n't")

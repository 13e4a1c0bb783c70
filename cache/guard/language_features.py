"""What the checks that hold in any language compare of a question: its numbers (digits,
number words from `language_words.json`, Chinese and Japanese numerals), quoted text,
names (capitalised words inside a sentence, Latin-script words in a text of another
script), the days it is about (today, tomorrow, a weekday), negations, the listed
opposites it says one side of (turn on / off) and the kind of answer its question word
asks for (a person, a time, a place, a reason); and, for the verifier, its words and
character pairs. Extracted once per text (cached)."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files

_LISTS = json.loads(
    files("cache.guard").joinpath("language_words.json").read_text(encoding="utf-8")
)
NEGATIONS: dict[str, frozenset[str]] = {
    lang: frozenset(words) for lang, words in _LISTS["negations"]["by_language"].items()
}
QUESTION_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    lang: {kind: tuple(words) for kind, words in kinds.items()}
    for lang, kinds in _LISTS["question_words"]["by_language"].items()
}
# Per language, pairs of sides; a side is word beginnings ("$" at the end: a whole word),
# or strings inside the text where words are not spaced or verbs agglutinate.
OPPOSITES: dict[str, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]] = {
    lang: tuple((tuple(x.split("|")), tuple(y.split("|"))) for x, y in pairs)
    for lang, pairs in _LISTS["opposites"]["by_language"].items()
}
# Per language, the days a question can be about (today, tomorrow, yesterday, the
# weekdays, the weekend), each written as a side of OPPOSITES is.
DAYS: dict[str, tuple[tuple[str, ...], ...]] = {
    lang: tuple(tuple(day.split("|")) for day in days)
    for lang, days in _LISTS["days"]["by_language"].items()
}
NUMBER_WORDS: dict[str, dict[str, float]] = {
    lang: {word: float(value) for word, value in words.items()}
    for lang, words in _LISTS["number_words"]["by_language"].items()
}
# Written without spaces between words: lists are looked for inside the text, and the
# text's words are its characters.
UNSPACED = frozenset({"zh", "ja"})
# Opposites are looked for inside the text: verbs agglutinate in Korean ("켜는", "켜요").
INSIDE_TEXT = UNSPACED | {"ko"}

_WORD = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*", re.UNICODE)
_DIGITS = re.compile(r"\d+(?:[.,]\d+)?")
_CJK_NUMERAL = re.compile(r"[零〇一二两三四五六七八九十百千万]+")
_CJK_DIGITS = {c: float(i) for i, c in enumerate("零一二三四五六七八九")} | {"〇": 0.0, "两": 2.0}
_CJK_SCALES = {"十": 10.0, "百": 100.0, "千": 1000.0, "万": 10000.0}
_QUOTED = re.compile(
    r"\"([^\"]+)\"|«\s*([^»]+?)\s*»|„([^“”]+)[“”]|\u201c([^\u201d]+)\u201d"
    r"|「([^」]+)」|『([^』]+)』|《([^》]+)》|'([^'\n]+)'(?!\w)"
)
_SENTENCE_END = re.compile(r"[.!?¿¡。！？]\s*")
_LATIN = re.compile(r"[A-Za-z][A-Za-z0-9+#.-]*")
_NON_LATIN_LETTER = re.compile(r"[^\W\dA-Za-z\u00c0-\u024f_]")
# A-not-A questions ask yes or no: "能不能" is "can or cannot", no negation.
_A_NOT_A = re.compile(r"(.)不\1")


@dataclass(frozen=True)
class LanguageFeatures:
    language: str
    numbers: tuple[float, ...]  # sorted; one is left out (the unit quantity, an article)
    measured: dict[float, str]  # a number in digits -> how the word after it starts
    days: frozenset[int]  # indexes into DAYS[language]: today, tomorrow, ..., the weekend
    quoted: frozenset[str]
    names: frozenset[str]  # lower-cased
    negations: int
    asks: str | None  # "who" | "when" | "where" | "why", from the first question word
    # (i, side) for each listed pair of opposites i of which the text says one side only
    opposites: frozenset[tuple[int, int]]
    words: frozenset[str]  # lower-cased words; characters for zh and ja
    text: str  # case-folded letters and digits only, for character comparisons

    def mentions(self, name: str) -> bool:
        return name in self.words or name in self.text


def _normalized(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'")


def _cjk_value(numeral: str) -> float:
    """一百 100, 三十五 35, 两千 2000, 五 5: scales multiply the digit before them."""
    total = current = 0.0
    for char in numeral:
        if char in _CJK_SCALES:
            total += (current or 1.0) * _CJK_SCALES[char]
            current = 0.0
        else:
            current = current * 10 + _CJK_DIGITS[char]
    return total + current


def _numbers(text: str, words: list[str], language: str) -> tuple[float, ...]:
    values = [float(m.replace(",", ".")) for m in _DIGITS.findall(text)]
    spelled = NUMBER_WORDS.get(language, {})
    values += [spelled[w] for w in words if w in spelled]
    if language in UNSPACED:
        values += [_cjk_value(m) for m in _CJK_NUMERAL.findall(text)]
    return tuple(sorted(v for v in values if v != 1.0))


def _measured(text: str, language: str) -> dict[float, str]:
    """What each number written in digits measures: the start of the word after it (its
    first three letters, enough to tell "Meilen" from "Kilometer" and to leave
    inflections alike: "милях", "миль"), or the character after it where words are not
    spaced ("100美元", "100人民币")."""
    size = 1 if language in UNSPACED else 3
    found: dict[float, str] = {}
    for match in re.finditer(r"(\d+(?:[.,]\d+)?)\s*([^\W\d_]+)", text):
        found[float(match[1].replace(",", "."))] = match[2].casefold()[:size]
    return found


def _quoted(text: str) -> frozenset[str]:
    found = set()
    for match in _QUOTED.finditer(text):
        quoted = next(group for group in match.groups() if group is not None)
        found.add(" ".join(quoted.casefold().split()))
    return frozenset(found)


def _names(text: str, language: str) -> frozenset[str]:
    """Capitalised words that do not start a sentence (not in German, which capitalises
    every noun), and Latin-script words in a text written in another script."""
    names: set[str] = set()
    if _NON_LATIN_LETTER.search(text) and language not in {"ru"}:
        names.update(w.casefold() for w in _LATIN.findall(text))
    if language != "de":
        for sentence in _SENTENCE_END.split(text):
            for word in _WORD.findall(sentence)[1:]:
                word = word.split("'")[-1]  # "l'Australie"
                if word[:1].isupper():
                    names.add(word.casefold())
    return frozenset(names)


def _negations(text: str, words: list[str], language: str) -> int:
    listed = NEGATIONS.get(language, frozenset())
    if language in UNSPACED:
        text = _A_NOT_A.sub("", text)
        return sum(text.count(n) for n in listed)
    if language == "ko":  # verb endings: "하지 않나요", "없어요"
        return sum(text.count(n) for n in listed)
    return sum(w in listed for w in words)


def _asks(text: str, words: list[str], language: str) -> str | None:
    """The kind of answer the first question word asks for."""
    first: tuple[int, str] | None = None
    joined = " " + " ".join(words) + " "
    for kind, cues in QUESTION_WORDS.get(language, {}).items():
        for cue in cues:
            at = text.find(cue) if language in UNSPACED else joined.find(f" {cue} ")
            if at >= 0 and (first is None or at < first[0]):
                first = (at, kind)
    return None if first is None else first[1]


def _says(side: tuple[str, ...], words: list[str], text: str, inside: bool) -> bool:
    if inside:
        return any(s in text for s in side)
    return any(w == s[:-1] if s.endswith("$") else w.startswith(s) for w in words for s in side)


def _days(words: list[str], text: str, language: str) -> frozenset[int]:
    inside = language in INSIDE_TEXT
    return frozenset(
        i for i, day in enumerate(DAYS.get(language, ())) if _says(day, words, text, inside)
    )


def _opposites(words: list[str], text: str, language: str) -> frozenset[tuple[int, int]]:
    """The sides of listed opposites the text says, where it says one side only."""
    inside = language in INSIDE_TEXT
    found = set()
    for i, (x, y) in enumerate(OPPOSITES.get(language, ())):
        says_x = _says_apart(x, y, words, text, inside)
        if says_x != _says_apart(y, x, words, text, inside):
            found.add((i, 0 if says_x else 1))
    return frozenset(found)


def _says_apart(side: tuple[str, ...], other: tuple[str, ...], words: list[str], text: str,
                inside: bool) -> bool:  # fmt: skip
    """Whether the text says `side` where it does not say `other`: the other side's
    strings that hold this side's ("비활성화" holds "활성화") are taken out of the text,
    and words that begin as the other side does are not counted."""
    if inside:
        for longer in other:
            if any(s in longer for s in side):
                text = text.replace(longer, "")
        return _says(side, words, text, inside)
    return _says(side, [w for w in words if not _says(other, [w], "", False)], text, inside)


@lru_cache(maxsize=8192)
def language_features(text: str, language: str) -> LanguageFeatures:
    text = _normalized(text)
    folded = text.casefold()
    words = [w.casefold() for w in _WORD.findall(text)]
    letters = "".join(c for c in folded if c.isalnum())
    return LanguageFeatures(
        language=language,
        numbers=_numbers(text, words, language),
        measured=_measured(text, language),
        days=_days(words, letters, language),
        quoted=_quoted(text),
        names=_names(text, language),
        negations=_negations(folded, words, language),
        asks=_asks(folded, words, language),
        opposites=_opposites(words, letters, language),
        words=frozenset(letters if language in UNSPACED else words),
        text=letters,
    )

"""What the guard compares of a question: its words, numbers and their units, content
words, negations, names, the roles of its phrases, the kind of answer it asks for,
quoted text and flags. Extracted once per text (cached: ~0.5 ms for a new question)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

from cache.guard import lexicon
from cache.guard.measures import measures, timing, units_in, whole_time_spans
from cache.guard.question_types import question_type
from cache.guard.roles import phrase_roles
from cache.guard.words import is_negation, number_value, stem, strip_possessive, tokenize
from cache.language import ENGLISH, language

# Text a question operates on: 'single', "double", `back` or curly quotes (an apostrophe
# inside a word, as in "what's", opens none), and command-line flags (-d, --rm; case
# matters: `git branch -d` merges first, `-D` does not).
_QUOTED = re.compile(
    r"(?<![\w'])'([^'\n]+?)'(?!\w)|\"([^\"\n]+)\"|`([^`\n]+)`"
    r"|\u201c([^\u201d\n]+)\u201d|\u2018([^\u2019\n]+)\u2019"
)
_FLAG = re.compile(r"(?:(?<=\s)|^)(--?[a-zA-Z][\w-]*)")


@dataclass(frozen=True)
class Features:
    words: tuple[str, ...]  # lower-cased tokens in order
    stems: frozenset[str]
    measures: tuple[tuple[float, str | None], ...]  # each number and its unit, in order
    units: tuple[str, ...]  # canonical units in order of appearance
    quantified_units: frozenset[str]  # units attached to a number
    asked_units: frozenset[str]  # units asked for: "how many miles", "what percent"
    content: tuple[str, ...]  # stems of the non-stopwords, in order
    content_at: tuple[int, ...]  # where each content word sits in `words`
    negated: tuple[tuple[str, ...], ...]  # for each negation, the content words it negates
    entities: frozenset[str]  # canonical entity names
    roles: dict[str, str]  # anchor -> "src" | "dst", "agent" | "patient", "replaced" ...
    qtype: str
    noncommutative: bool
    particles: frozenset[tuple[str, str]]  # (verb stem, particle): ("turn", "on")
    timing: frozenset[str]  # "before" | "during" | "after" a stated time ("in the first 48 hours")
    quoted: frozenset[str]  # the words inside quotes ("how do you say 'I went'": i, went)
    flags: frozenset[str]  # command-line flags: "-d", "--rm"
    language: str = ENGLISH  # ISO 639-1 (cache/language.py): the rules read English only

    @property
    def numbers(self) -> tuple[float, ...]:
        """The numbers in order of appearance."""
        return tuple(value for value, _ in self.measures)


def _quoted_words(text: str) -> set[str]:
    words: set[str] = set()
    for match in _QUOTED.finditer(text):
        quoted = next(group for group in match.groups() if group is not None)
        words.update(re.findall(r"\w+", quoted.lower()))
    return words


def _affix_negated(word: str) -> str | None:
    """The word a negating affix negates: "visa-free" says "without a visa", "non-empty"
    says "not empty"."""
    head, _, tail = word.rpartition("-")
    if tail == "free" and head.isalpha():
        return head
    if head == "non" and tail.isalpha():
        return tail
    return None


# Content words a negation reaches: "no longer have access" negates access, "hasn't been
# merged" merged; two, because the first is often a particle or adverb.
SCOPE = 2


def _negated(words: list[str], content_at: list[int], content: list[str]) -> list[tuple[str, ...]]:
    """Each negation with the content words in its scope: the next SCOPE words after it
    ("hasn't been merged": merged), nothing for a closing "or not" / "yes or no"."""
    scopes: list[tuple[str, ...]] = []
    for i, word in enumerate(words):
        affixed = _affix_negated(word)
        if affixed is not None:
            scopes.append((_content_word(affixed),))
        # "without losing the changes" asks to keep them, and "won't stop running" says
        # it keeps running: two negatives, no negation.
        elif is_negation(word) and not _without_loss(words, i) and words[i + 1 : i + 2] != ["stop"]:
            after = [c for at, c in zip(content_at, content, strict=True) if at > i and c != "not"]
            scopes.append(tuple(after[:SCOPE]))
    return scopes


def _entities(tokens: list[tuple[str, str]], words: list[str]) -> set[str]:
    """Proper names and technical names: capitalised or mixed-case words not starting a
    sentence, acronyms, letter+digit names, and a gazetteer for names users type in
    lower case (countries, cities, languages, products). Aliases map to one name."""
    found: set[str] = set()
    words = [w.replace("-", "") for w in words]  # "Wi-Fi" is "wifi", "GPT-4" is "gpt4"
    for n in (3, 2):  # multi-word names first: "new york", "south korea"
        for i in range(len(words) - n + 1):
            phrase = " ".join(words[i : i + n])
            if phrase in lexicon.ENTITY_ALIASES or phrase in lexicon.GAZETTEER:
                found.add(lexicon.ENTITY_ALIASES.get(phrase, phrase))
    # Punctuation is not tokenised, so only the first word is known to start a sentence.
    for i, ((original, _), lower) in enumerate(zip(tokens, words, strict=True)):
        if lower in lexicon.ENTITY_ALIASES:
            found.add(lexicon.ENTITY_ALIASES[lower])
        elif lower in lexicon.GAZETTEER:
            found.add(lower)
        elif (
            lower in lexicon.NOT_ENTITIES
            or lower in lexicon.UNITS
            or number_value(lower) is not None
        ):
            pass
        elif len(original) >= 2 and original.isupper() and original.isalpha():
            found.add(lower)  # acronyms: AWS, NBA
        elif any(c.isdigit() for c in original) and any(c.isalpha() for c in original):
            found.add(lower)  # python3, ps5, gpt-4
        elif original[:1].isupper() and i > 0:
            found.add(lower)  # Paris, Django
        elif any(c.isupper() for c in original[1:]):
            found.add(lower)  # iPhone, macOS, PyTorch
    return found


# The stems of the verbs a "without" before them cancels (see `_without_loss`).
_LOSS_STEMS = frozenset(stem(w) for w in lexicon.LOSS_VERBS)


def _content_word(word: str) -> str:
    """A content word as rules compare it: a number's value ("2nd", "second" and "2" are
    one word), a unit's name ("%" and "percent"), else its stem."""
    value = number_value(word)
    if value is not None:
        return f"{value:g}"
    if is_negation(word):
        return "not"  # "hasn't shipped yet" and "not yet shipped" say the same
    return lexicon.UNITS.get(word) or stem(word)


def _without_loss(words: list[str], i: int) -> bool:
    """Whether words[i] is "without" before a loss verb ("without losing the changes")."""
    return words[i] == "without" and i + 1 < len(words) and stem(words[i + 1]) in _LOSS_STEMS


def _content(words: list[str]) -> tuple[list[int], list[str]]:
    """Where the content words sit, and each as rules compare it. "without losing" is
    "keep", so it compares equal to the question that says so."""
    at: list[int] = []
    content: list[str] = []
    for i, word in enumerate(words):
        if word in lexicon.STOPWORDS or _without_loss(words, i):
            continue
        at.append(i)
        content.append("keep" if i and _without_loss(words, i - 1) else _content_word(word))
    return at, content


@lru_cache(maxsize=8192)
def features(text: str) -> Features:
    tokens = tokenize(text)
    words = whole_time_spans([strip_possessive(lower) for _, lower in tokens])
    units, quantified = units_in(words)
    content_at, content = _content(words)
    return Features(
        words=tuple(words),
        stems=frozenset(stem(w) for w in words),
        measures=tuple(measures(words)),
        units=tuple(units),
        quantified_units=frozenset(quantified),
        asked_units=frozenset(
            lexicon.UNITS[w]
            for v, w in itertools.pairwise(words)
            if v in lexicon.ASKING_WORDS and w in lexicon.UNITS
        ),
        content=tuple(content),
        content_at=tuple(content_at),
        negated=tuple(_negated(words, content_at, content)),
        entities=frozenset(_entities(tokens, words)),
        roles=phrase_roles(words),
        qtype=question_type(text, words),
        noncommutative=bool(lexicon.NONCOMMUTATIVE & set(words)) or "/" in text,
        particles=frozenset(
            (stem(v), p)
            for v, p in itertools.pairwise(words)
            if p in lexicon.OPPOSITE_PARTICLES and v not in lexicon.STOPWORDS
        ),
        timing=frozenset(timing(words)),
        quoted=frozenset(_quoted_words(text)),
        flags=frozenset(_FLAG.findall(text)),
        language=language(text),
    )

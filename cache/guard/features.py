"""What the guard compares of a question: its words, numbers and their units, content
words, negations, names, the roles of its phrases, the kind of answer it asks for,
quoted text and flags. Extracted once per text (cached: ~0.5 ms for a new question)."""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from cache.guard import lexicon
from cache.guard.question_types import QUESTION_TYPES
from cache.language import ENGLISH, language

_TOKEN = re.compile(
    r"°\s?[cfk]\b"  # degree units
    r"|[$€£¥₹%]"  # currency signs (lexicon.CURRENCY_SIGNS) and percent
    r"|\d+/\d+"  # fractions
    r"|[=!<>]==?|&&|\|\||[-=]>|[+\-*/%]=|\+\+|--(?!\w)"  # operators: === vs ==, != ...
    r"|\d+(?:[.,]\d+)*(?:st|nd|rd|th|k)?(?![^\W_])"  # numbers, ordinals, 300k
    r"|[^\W\d_]+\d+[^\W\d_]+(?![^\W_])"  # numeronyms: k8s, i18n (no number in them)
    r"|[^\W\d_]+(?:[.'\u2019+#-][^\W\d_0-9]+)*[+#]*"  # words: node.js, c++, c#, don't, e-mail
    r"|[^\W_]+"  # alphanumerics: python3, gpt4, 5g
    r"|[-+*/^]",  # arithmetic, kept only between numbers or variables (see _tokens)
    re.UNICODE | re.IGNORECASE,
)
_ARITHMETIC = frozenset("-+*/^")
# Where a clause ends: punctuation before a space or the end, or a free-standing dash.
_CLAUSE = re.compile(r"[,;:.!?()]+(?:\s|$)|\s[-\u2013\u2014]+\s")
# Words after which a question word still opens a question ("at what age", "do you know
# when"), as offsets just past them in a clause's joined words.
_CUE_OPENERS = r"\b(?:" + "|".join(sorted(lexicon.CUE_OPENERS)) + r") "
_WITHOUT = re.compile(r"\bw/o\b", re.IGNORECASE)
_NUMERIC = re.compile(r"^\d+(?:[.,]\d+)*(?:st|nd|rd|th|k)?$")
_NUMBER_WITH_UNIT = re.compile(r"^(\d+(?:\.\d+)?)([a-z]+)$")
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


def stem(word: str) -> str:
    """A crude suffix stripper: enough to match increase/increases/increasing."""
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


# Asked ~60 times a text (units, entities, direction anchors), mostly about the same
# common words: cached, a new question's features take ~0.12 ms instead of ~0.15 ms.
@lru_cache(maxsize=16384)
def _number_value(token: str) -> float | None:
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


def _strip_possessive(word: str) -> str:
    return word[:-2] if word.endswith("'s") and len(word) > 3 else word


def _tokens(text: str) -> list[tuple[str, str]]:
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


def _numbers(words: list[str]) -> list[tuple[float, str | None]]:
    """Each number in order, with the unit that follows it ("30 years", "6 %"), if any.
    Currencies count as no unit: a sign is often left out ("$300k" vs "300k")."""
    values: list[tuple[float, str | None]] = []
    previous_tens = previous_number = False
    for i, word in enumerate(words):
        value = 1.0 if word == "k" else _number_value(word)
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


def _whole_time_spans(words: list[str]) -> list[str]:
    """Each span of time in the largest unit it fills whole: "a 14-day trip" and "a two
    week trip" ask the same, as do "the first 12 months" and "the first year" (a lone 1
    is then the unit quantity, see `_numbers`). Rates stay ("7 days a week" is always
    open, not one week), and so do ordinals ("the 14th day") and compound numbers."""
    spans = list(words)
    for i in range(len(words) - 1):
        word, unit_word = words[i], words[i + 1]
        unit = lexicon.UNITS.get(unit_word)
        if unit not in lexicon.LARGER_TIME_UNITS or unit_word.endswith("ly"):
            continue
        cardinal = word.isdigit() or word in lexicon.CARDINAL_WORDS
        compound = i > 0 and _number_value(words[i - 1]) is not None
        rate = i + 2 < len(words) and words[i + 2] in lexicon.PER_WORDS
        if cardinal and not compound and not rate:
            value, larger = _larger_span(int(_number_value(word) or 0), unit)
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


def _units(words: list[str]) -> tuple[list[str], set[str]]:
    """All units in order, and those that measure a stated number ("30 days")."""
    units: list[str] = []
    quantified: set[str] = set()
    numeric = [_number_value(w) is not None for w in words] + [False]
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


def _quoted_words(text: str) -> set[str]:
    words: set[str] = set()
    for match in _QUOTED.finditer(text):
        quoted = next(group for group in match.groups() if group is not None)
        words.update(re.findall(r"\w+", quoted.lower()))
    return words


def is_negation(word: str) -> bool:
    return word in lexicon.NEGATIONS or word.endswith("n't")


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


def _timing(words: list[str]) -> set[str]:
    """Whether a question asks before, during or after a stated time: a temporal
    preposition shortly before a number, an ordinal or a time unit ("in the first 48
    hours" vs "after the first 48 hours", "within 30 days" vs "after 30 days")."""
    found: set[str] = set()
    for i, word in enumerate(words):
        relation = lexicon.TEMPORAL_PREPOSITIONS.get(word)
        ahead = words[i + 1 : i + 4]
        if relation is None or (word == "in" and ahead and _number_value(ahead[0]) is not None):
            continue
        if any(
            lexicon.UNITS.get(w) in lexicon.TIME_UNIT_NAMES
            or _number_value(w) is not None
            or w in lexicon.TIME_ORDINALS
            for w in ahead
        ):
            found.add(relation)
    return found


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
            or _number_value(lower) is not None
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


def _roles(words: list[str]) -> dict[str, str]:
    """Direction of "A to B", "from A", "A than B", who does what in "who did A beat",
    what replaces what: anchors (content words) get a role; an anchor seen in two roles
    is dropped as ambiguous."""
    roles: dict[str, set[str]] = {}

    def canonical(word: str) -> str:
        return lexicon.UNITS.get(word) or lexicon.ENTITY_ALIASES.get(word) or stem(word)

    def anchor(start: int, step: int, skip_comparatives: bool = False) -> str | None:
        i, seen = start, 0
        while 0 <= i < len(words) and seen < 4:
            word = words[i]
            # "from you to another carrier": the anchor of "from" is not past the "to".
            if word in lexicon.CLAUSE_BREAKS or word in lexicon.DIRECTION_WORDS:
                return None
            comparative = skip_comparatives and (
                word in lexicon.COMPARATIVE_WORDS or (word.endswith("er") and len(word) > 4)
            )
            if word not in lexicon.STOPWORDS and not comparative and _number_value(word) is None:
                return canonical(word)
            i += step
            seen += 1
        return None

    def mark(word: str | None, role: str) -> None:
        if word:
            roles.setdefault(word, set()).add(role)

    def head(start: int) -> str | None:
        """The last word of the phrase that starts at `start` ("baking soda in pancakes":
        soda), past any leading articles."""
        last = None
        for word in words[start:]:
            if word in lexicon.STOPWORDS or _number_value(word) is not None:
                if last is not None or word not in lexicon.ARTICLES:
                    break
                continue
            last = canonical(word)
        return last

    def after(start: int, word: str) -> int | None:
        return next((j + 1 for j in range(start, len(words)) if words[j] == word), None)

    has_from = "from" in words
    for i, word in enumerate(words):
        left, right = anchor(i - 1, -1), anchor(i + 1, 1)
        if (
            word in {"in", "to", "into"}
            and left in lexicon.UNIT_NAMES
            and right in lexicon.UNIT_NAMES
        ):
            mark(left, "src")  # "100 dollars in euros": a conversion from dollars
            mark(right, "dst")
        elif word == "from":
            mark(anchor(i - 1, -1), "dst")
            mark(anchor(i + 1, 1), "src")
        elif word == "of" and words[i - 1 : i] == ["out"]:  # "copy a file out of a container"
            mark(anchor(i + 1, 1), "src")
        # "who did South Africa beat" asks whom South Africa beat; "who beat South Africa"
        # who beat it: the same name is the agent in one, the patient in the other.
        elif word in {"who", "whom", "which"}:
            # "which team did X beat": the verb follows the noun.
            at = i + 2 if word == "which" else i + 1
            verb = words[at] if at + 1 < len(words) else None
            if verb in lexicon.DOING_AUXILIARIES:
                mark(anchor(at + 1, 1), "agent")
            elif verb not in lexicon.STOPWORDS and verb not in lexicon.CLAUSE_BREAKS:
                mark(anchor(at + 1, 1), "patient")
        elif word in lexicon.DIRECTIONAL_TO and (has_from or lexicon.MOTION_WORDS & set(words)):
            if not has_from:
                mark(anchor(i - 1, -1), "src")
            mark(anchor(i + 1, 1), "dst")
        elif word == "than":
            mark(anchor(i - 1, -1, skip_comparatives=True), "src")
            mark(anchor(i + 1, 1), "dst")
        # What replaces what: "use A instead of B", "A in place of B", "substitute A for
        # B", "replace B with A".
        elif word == "of" and words[i - 1 : i] == ["instead"]:
            mark(anchor(i - 2, -1), "replacement")
            mark(head(i + 1), "replaced")
        elif word == "of" and words[i - 2 : i] == ["in", "place"]:
            mark(anchor(i - 3, -1), "replacement")
            mark(head(i + 1), "replaced")
        elif word in {"substitute", "replace"}:
            joint = after(i + 1, "for" if word == "substitute" else "with")
            if joint is not None:
                first, second = head(i + 1), head(joint)
                if word == "replace":
                    first, second = second, first
                mark(first, "replacement")
                mark(second, "replaced")
    return {word: next(iter(r)) for word, r in roles.items() if len(r) == 1}


def _question_type(text: str, text_words: list[str]) -> str:
    """The type whose cue comes first ("when did the man who..." is a when-question). A cue
    counts where it opens a clause, or follows a preposition or a verb of asking ("at what
    age", "do you know when"); elsewhere "when", "where" and "whose" join a clause to a
    noun or verb ("stays visible when I scroll", "a circle whose radius is 5"). With no
    cue, `text_words` (the whole text's) may still ask yes or no."""
    for clause in _CLAUSE.split(text):
        words = [_strip_possessive(lower) for _, lower in _tokens(clause)]
        joined = " ".join(words)
        opens = {0} | {m.end() for m in re.finditer(_CUE_OPENERS, joined)}
        best, best_at = "other", len(joined) + 1
        for qtype, pattern in QUESTION_TYPES:
            for match in re.finditer(pattern, joined):
                if match.start() in opens and match.start() < best_at:
                    best, best_at = qtype, match.start()
                    break
        if best == "other":
            continue
        if best in {"count", "amount"} and lexicon.PRICE_WORDS & set(words):
            return "price"
        return best
    return _yes_or_no(text_words) or "other"


def _yes_or_no(text_words: list[str]) -> str | None:
    """A question with no question word that opens with an auxiliary asks yes or no, a
    different answer from how much or when: "whether" a fact holds ("does the app support
    dark mode", which "how do I turn on dark mode" is not), else "yes/no" ("can I cancel
    online", near enough to "how can I cancel online"). Not requests ("can you check my
    order"), questions whether a thing exists ("is there a limit": the limit) nor
    questions between alternatives ("is it the landlord's job or mine")."""
    words = list(itertools.dropwhile(lambda w: w in lexicon.GREETINGS, text_words))
    if len(words) < 2 or words[0] not in lexicon.POLAR_AUXILIARIES:
        return None
    if (words[0] in lexicon.REQUEST_AUXILIARIES and words[1] == "you") or words[1] == "there":
        return None
    if any(w == "or" and nxt != "not" for w, nxt in itertools.pairwise([*words, ""])):
        return None
    return "whether" if words[0] in lexicon.DO_AUXILIARIES else "yes/no"


# The stems of the verbs a "without" before them cancels (see `_without_loss`).
_LOSS_STEMS = frozenset(stem(w) for w in lexicon.LOSS_VERBS)


def _content_word(word: str) -> str:
    """A content word as rules compare it: a number's value ("2nd", "second" and "2" are
    one word), a unit's name ("%" and "percent"), else its stem."""
    value = _number_value(word)
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
    tokens = _tokens(text)
    words = _whole_time_spans([_strip_possessive(lower) for _, lower in tokens])
    units, quantified = _units(words)
    content_at, content = _content(words)
    return Features(
        words=tuple(words),
        stems=frozenset(stem(w) for w in words),
        measures=tuple(_numbers(words)),
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
        roles=_roles(words),
        qtype=_question_type(text, words),
        noncommutative=bool(lexicon.NONCOMMUTATIVE & set(words)) or "/" in text,
        particles=frozenset(
            (stem(v), p)
            for v, p in itertools.pairwise(words)
            if p in lexicon.OPPOSITE_PARTICLES and v not in lexicon.STOPWORDS
        ),
        timing=frozenset(_timing(words)),
        quoted=frozenset(_quoted_words(text)),
        flags=frozenset(_FLAG.findall(text)),
        language=language(text),
    )

"""The near-miss guard: after a vector match, reject candidates whose answer would differ.

Sentence embeddings score "Convert 100 °F to Celsius" vs "Convert 100 °C to
Fahrenheit" at 0.99, above most true paraphrases. The guard compares the two questions
on the features that change an answer while barely moving the vector: numbers (a span
of time in its largest whole unit: "14 days" is "2 weeks"), units, negation, opposite
words, before/during/after a time, direction (A to B vs B to A), two names trading
roles, named entities (acronyms match what they spell), contrasting alternatives and
an audience on one side only ("in children"), the kind of question, one word exchanged
in the same frame (operators such as == and === included), one word added inside a
shared phrase ("president" vs "vice president"), a condition added to a whole question
("... while roaming"), different quoted text or flags, and what replaces what ("A
instead of B"). Last, given the embeddings' similarity, the overlap bar
(`overlap.py`): questions that share most of their words need a similarity that rises
with what they share. Each rule is a few set operations over pre-extracted features,
cached per text (extracting a new question's takes ~0.5 ms once; a check then costs
tens of microseconds), and a rejection names its rule so the dry run can explain it.
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from cache import lexicon
from cache.overlap import DEFAULT_BAR, WordOverlap, word_overlap


@dataclass(frozen=True)
class Verdict:
    ok: bool
    rule: str | None = None
    detail: str = ""


PASS = Verdict(True)

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
    """(original, lower-case) tokens; curly apostrophes normalised."""
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
    return [t for i, t in enumerate(tokens) if t[1] not in _ARITHMETIC or _operands(tokens, i)]


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


def _negative(word: str) -> bool:
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
        elif _negative(word) and not _without_loss(words, i) and words[i + 1 : i + 2] != ["stop"]:
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
        for qtype, pattern in lexicon.QUESTION_TYPES:
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


def _stem_map(pairs: list[tuple[str, str]]) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    for x, y in pairs:
        table.setdefault(stem(x), set()).add(stem(y))
        table.setdefault(stem(y), set()).add(stem(x))
    return table


def _group_pairs(groups: list[set[str]]) -> list[tuple[str, str]]:
    return [(x, y) for group in groups for x, y in itertools.combinations(sorted(group), 2)]


ANTONYMS = _stem_map(lexicon.ANTONYM_PAIRS)
SYNONYMS = _stem_map(_group_pairs(lexicon.SYNONYM_GROUPS))
CONTRASTS = _stem_map(_group_pairs(lexicon.CONTRAST_GROUPS))
AUDIENCES = [frozenset(stem(w) for w in group) for group in lexicon.AUDIENCE_GROUPS]
LOSS_STEMS = frozenset(stem(w) for w in lexicon.LOSS_VERBS)
IMPLIED_NEGATIVES = frozenset(stem(w) for w in lexicon.IMPLIED_NEGATIVES)
ENTITY_PARENT_STEMS = {stem(kind): stem(parent) for kind, parent in lexicon.ENTITY_PARENTS.items()}
# Longest phrase the order rule sees trading places ("Thomas Jefferson"): longer runs
# are clauses moved around, not two names swapped.
MAX_SWAPPED = 3
# Content words a negation reaches: "no longer have access" negates access, "hasn't been
# merged" merged; two, because the first is often a particle or adverb.
SCOPE = 2


def _content_word(word: str) -> str:
    """A content word as rules compare it: a number's value ("2nd", "second" and "2" are
    one word), a unit's name ("%" and "percent"), else its stem."""
    value = _number_value(word)
    if value is not None:
        return f"{value:g}"
    if _negative(word):
        return "not"  # "hasn't shipped yet" and "not yet shipped" say the same
    return lexicon.UNITS.get(word) or stem(word)


def _without_loss(words: list[str], i: int) -> bool:
    """Whether words[i] is "without" before a loss verb ("without losing the changes")."""
    return words[i] == "without" and i + 1 < len(words) and stem(words[i + 1]) in LOSS_STEMS


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
    )


def _fmt(values: object) -> str:
    if isinstance(values, tuple | list | set | frozenset):
        items = sorted(values) if isinstance(values, set | frozenset) else list(values)
        return "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in items) + "}"
    return str(values)


def _mentions(f: Features, entity: str) -> bool:
    if entity in f.entities:
        return True
    # A plural names the same thing ("IP addresses" and "IPs").
    return all(
        part in f.words
        or stem(part) in f.stems
        or f"{part}s" in f.words
        or (part.endswith("s") and part[:-1] in f.words)
        for part in entity.split()
    )


def _initials_match(acronym: str, words: tuple[str, ...], start: int) -> list[str]:
    """The words from `start` whose initials spell `acronym` ("of", "and", "the" may sit
    between them; "i" counts as the numeral in "World War I"), or [] if they do not."""
    run: list[str] = []
    for word in words[start:]:
        if len(run) == len(acronym):
            break
        if run and word in lexicon.ACRONYM_SKIPPED:
            continue
        if (word in lexicon.STOPWORDS and word != "i") or word[0] != acronym[len(run)]:
            return []
        run.append(word)
    return run if len(run) == len(acronym) else []


def _spelled_out(
    acronyms: set[str], names: set[str], words: tuple[str, ...]
) -> tuple[set[str], set[str]]:
    """Drops each acronym that the other question spells out ("WWI" vs "World War I",
    "NYC" vs "New York City"), and the names in the words that spell it."""
    acronyms, names = set(acronyms), set(names)
    for acronym in sorted(acronyms):
        if not (2 <= len(acronym) <= 6 and acronym.isalpha()):
            continue
        for start in range(len(words)):
            run = _initials_match(acronym, words, start)
            if run:
                acronyms.discard(acronym)
                names -= set(run)
                break
    return acronyms, names


def _alike(x: str, y: str) -> bool:
    """The same word, up to inflection (annual/annually), two synonyms (kid/child), or a
    name and the kind it is (ubuntu/linux)."""
    return (
        x == y
        or _same_word(x, y)
        or y in SYNONYMS.get(x, ())
        or ENTITY_PARENT_STEMS.get(x) == y
        or ENTITY_PARENT_STEMS.get(y) == x
    )


def _implied_negatives(f: Features) -> set[str]:
    """Verbs that carry a negation, unless negated themselves ("won't stop barking")."""
    return {
        stem(w)
        for i, w in enumerate(f.words)
        if stem(w) in IMPLIED_NEGATIVES and not (i and _negative(f.words[i - 1]))
    }


def _anchored_negations(f: Features, other: Features) -> int:
    """How many of f's negations negate a word the other question mentions."""
    said = [word for word in other.content if word != "not"]
    return sum(any(_alike(w, s) for w in scope for s in said) for scope in f.negated)


def _exchange_verdict(
    a: Features, b: Features, related: dict[str, set[str]], rule: str
) -> Verdict | None:
    """Rejects when a word only in `a` has its related word (antonym, alternative) only
    in `b`, unless the two are one word or name the same thing ("kid" and "child")."""
    for x in a.stems - b.stems:
        for y in related.get(x, ()):
            if y in b.stems and y not in a.stems and not _alike(x, y):
                return Verdict(False, rule, f"{x!r} vs {y!r}")
    return None


def _units_name_each_number(a: Features, b: Features) -> bool:
    """Reordering numbers says the same thing when each one is told apart by its unit
    ("$300,000 at 6% for 30 years" vs "a 30-year $300k loan at 6%"); numbers without
    one, or two of a unit, keep their order ("10 minus 4", "from 5 to 10 minutes")."""
    if sorted(a.measures, key=str) != sorted(b.measures, key=str):
        return False
    names = [unit for _, unit in a.measures]
    return len(set(names)) == len(names)  # at most one number without a unit


def _swapped(a: Features, b: Features) -> bool:
    """Two names or phrases trade places and everything else stays put ("did Thomas
    Jefferson succeed John Adams" vs "did John Adams succeed Thomas Jefferson", "is a
    square a rectangle" vs "is a rectangle a square"). Moving a phrase ("the world's
    longest river" vs "the longest river in the world"), turning a compound around
    ("refund policy" vs "policy on refunds", "the equation for the combustion of methane"
    vs "the methane combustion equation") or the two sides of a symmetric operator
    ("17 times 23", "Venus or Serena") is not a swap."""
    if len(a.content) != len(b.content) or sorted(a.content) != sorted(b.content):
        return False
    p, s = _frame(a.content, b.content)
    mid_a, mid_b = a.content[p : len(a.content) - s], b.content[p : len(b.content) - s]
    n = len(mid_a)
    for i, j in itertools.combinations(range(1, n + 1), 2):
        first, middle, last = mid_a[:i], mid_a[i : j - 1], mid_a[j - 1 :]
        if max(len(first), len(last)) > MAX_SWAPPED or mid_b != last + middle + first:
            continue
        # The words linking the two phrases, in each question.
        link_a = a.words[a.content_at[p + i - 1] + 1 : a.content_at[p + j - 1]]
        after_last = p + len(last)
        link_b = b.words[b.content_at[after_last - 1] + 1 : b.content_at[after_last + len(middle)]]
        return _role_swap(link_a, link_b, adjacent=not middle)
    return False


def _role_swap(link_a: tuple[str, ...], link_b: tuple[str, ...], adjacent: bool) -> bool:
    """Whether two phrases that trade places, joined by these words, swap roles."""
    joining = [w for w in link_a + link_b if w not in lexicon.ARTICLES]
    if joining and all(w in lexicon.SYMMETRIC for w in joining):
        return False  # "17 times 23", "cats and dogs", "Venus or Serena"
    if adjacent:
        # Neighbours trade roles only in the same frame ("the buyer has if the seller"
        # vs "the seller has if the buyer"); otherwise the question was turned around
        # ("refund policy" vs "policy on refunds", "feet in a mile" vs "a mile is how
        # many feet").
        return bool(link_a) and link_a == link_b
    # English turns "X of Y" into "Y X": a genitive on one side only is that inversion.
    return bool(lexicon.GENITIVE_WORDS & set(link_a)) == bool(lexicon.GENITIVE_WORDS & set(link_b))


def _frame(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[int, int]:
    """How many words two sequences share at the start, then at the end (the two never
    overlap): what lies between is where they differ."""
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return p, s


def _american(word: str) -> str:
    """A stem in American spelling: colour/color, organis(e)/organiz(e), defenc(e)/defens(e)
    (stems, so "-ise" is "is"); short words keep theirs (hour, tour, this)."""
    if len(word) >= 5 and word.endswith("our"):
        return word[:-3] + "or"
    if len(word) >= 6 and word.endswith(("is", "ys")):
        return word[:-1] + "z"
    if len(word) >= 6 and word.endswith("enc"):
        return word[:-1] + "s"
    return word


def _same_word(x: str, y: str) -> bool:
    """One word up to inflection, hyphens, abbreviation or British spelling (spider/spiders,
    e-mail/email, env/environment, colour/color); operators and numbers are never "the
    same" as another."""
    x, y = _american(x.replace("-", "")), _american(y.replace("-", ""))
    if not (x.isalpha() and y.isalpha()):
        return False
    # A shared stem of six letters or more, most of the shorter word: pythagorean and
    # pythagoras, difference and different (transfer and transform share too little).
    shorter = min(len(x), len(y))
    shared = next((i for i in range(shorter) if x[i] != y[i]), shorter)
    return shared == shorter or (shared >= 6 and shared >= 0.8 * shorter)


def _comparable_units(a: set[str], b: set[str]) -> tuple[set[str], set[str]]:
    """ "degrees" stands for whichever temperature scale the other question names."""
    temps = lexicon.TEMPERATURE_UNITS
    if "degree" in a and b & temps:
        a = (a - {"degree"}) | (b & temps)
    if "degree" in b and a & temps:
        b = (b - {"degree"}) | (a & temps)
    return a, b


def weighed_overlap(a: Features, b: Features) -> WordOverlap | None:
    """The word overlap the bar weighs, or None when the content words are the same:
    questions that differ only in function words ("what's" / "what is") leave the bar
    nothing to weigh (the rules above judge "can I" / "should I"). All words count in
    the overlap, function words too: paraphrases reword "how do I" as well."""
    return None if a.content == b.content else word_overlap(a.words, b.words)


class Guard:
    """`check(cached, query)` -> Verdict. Rules can be switched off by name."""

    RULES = (
        "numbers",
        "units",
        "negation",
        "polarity",
        "order",
        "entities",
        "literal",
        "contrast",
        "question_type",
        "substitution",
        "modifier",
        "qualifier",
        "overlap",
    )

    def __init__(self, rules: tuple[str, ...] = RULES) -> None:
        unknown = set(rules) - set(self.RULES)
        if unknown:
            raise ValueError(f"unknown guard rules {sorted(unknown)}; known: {self.RULES}")
        self.rules = rules
        # The overlap bar weighs the similarity too; the other rules read the words only.
        self._word_rules = tuple(r for r in rules if r != "overlap")
        self.bar = DEFAULT_BAR if "overlap" in rules else None

    def check(self, cached: str, query: str, similarity: float | None = None) -> Verdict:
        """The verdict on serving `cached`'s answer to `query`; with their embeddings'
        `similarity`, the overlap bar applies too."""
        if cached == query:
            return PASS
        a, b = features(cached), features(query)
        for rule in self._word_rules:
            verdict = getattr(self, f"_{rule}")(a, b)
            if verdict is not None:
                return verdict
        if similarity is None or self.bar is None:
            return PASS
        overlap = weighed_overlap(a, b)
        if overlap is None or self.bar.admits(similarity, overlap):
            return PASS
        return Verdict(
            False,
            "overlap",
            f"similarity {similarity:.3f} < {self.bar.required(overlap):.3f} needed by "
            f"questions sharing {overlap.jaccard:.0%} of their words",
        )

    @staticmethod
    def _numbers(a: Features, b: Features) -> Verdict | None:
        if sorted(a.numbers) != sorted(b.numbers):
            return Verdict(False, "numbers", f"{_fmt(a.numbers)} vs {_fmt(b.numbers)}")
        return None

    @staticmethod
    def _units(a: Features, b: Features) -> Verdict | None:
        """Different units when both name some, or a measured quantity whose unit the other
        question never mentions ("within 30 days" vs "within 30 weeks")."""
        ua, ub = _comparable_units(set(a.units), set(b.units))
        qa, qb = _comparable_units(set(a.quantified_units), set(b.quantified_units))
        # A currency sign on one side only is usually just left out ("300k" vs "$300,000").
        qa, qb = qa - lexicon.CURRENCY_UNITS, qb - lexicon.CURRENCY_UNITS
        if qa and qb and qa != qb:  # "100 km in miles" vs "100 miles in km"
            return Verdict(False, "units", f"{_fmt(qa)} vs {_fmt(qb)} measured")
        # "what is 15% of 80" states the percentage that "15 is what percent of 80" asks.
        for stated, asked in ((qa, b.asked_units), (qb, a.asked_units)):
            if stated & asked:
                return Verdict(False, "units", f"{_fmt(stated & asked)} stated vs asked")
        if ((ua - ub) and (ub - ua)) or (qa - ub) or (qb - ua):
            return Verdict(False, "units", f"{_fmt(ua)} vs {_fmt(ub)}")
        return None

    @staticmethod
    def _negation(a: Features, b: Features) -> Verdict | None:
        """One question negates what the other asks plainly ("a branch that has been
        merged" vs "hasn't been merged"). Only a negation of words the other question
        also uses counts: "not blank" for "non-empty", "didn't arrive" for "missing" say
        the same thing in other words."""
        if len(a.negated) % 2 == len(b.negated) % 2:
            return None
        count_a, count_b = _anchored_negations(a, b), _anchored_negations(b, a)
        if count_a % 2 == count_b % 2:
            return None
        # The other side may say it with a verb that carries the negation ("to not pay
        # the fee" vs "to avoid the fee"), as long as the negated side does not use it too.
        plain, negated = (a, b) if count_a % 2 == 0 else (b, a)
        if _implied_negatives(plain) - negated.stems:
            return None
        return Verdict(False, "negation", "one question is negated, the other is not")

    @staticmethod
    def _polarity(a: Features, b: Features) -> Verdict | None:
        opposed = _exchange_verdict(a, b, ANTONYMS, "polarity")
        if opposed is not None:
            return opposed
        if a.timing and b.timing and not a.timing & b.timing:
            return Verdict(False, "polarity", f"{_fmt(a.timing)} vs {_fmt(b.timing)} a time")
        for verb, particle in a.particles - b.particles:
            opposite = (verb, lexicon.OPPOSITE_PARTICLES[particle])
            if opposite in b.particles and opposite not in a.particles:
                return Verdict(False, "polarity", f"{verb!r} {particle} vs {opposite[1]}")
        return None

    @staticmethod
    def _substitution(a: Features, b: Features) -> Verdict | None:
        """The same question frame with one word exchanged ("car insurance" vs "home
        insurance", "check my balance" vs "change my balance") is nearly always a
        different question: true paraphrases reword the frame too, or swap a word for a
        synonym. The frame is the content words both questions share at the start and
        at the end. Longer exchanges are left to the overlap bar: "the most" for "the
        maximum amount" is rewording, and its similarity says so."""
        p, s = _frame(a.content, b.content)
        mid_a, mid_b = a.content[p : len(a.content) - s], b.content[p : len(b.content) - s]
        if len(mid_a) != 1 or len(mid_b) != 1 or p + s == 0:
            return None
        (x,), (y,) = mid_a, mid_b
        # A word and its own inflection or spelling (spider/spiders, e-mail/email), or a
        # synonym, is one word; operators are not (== vs ===).
        if _alike(x, y):
            return None
        # A verb that carries the negation for "not" and a verb: "avoid" vs "not pay".
        if {x, y} & IMPLIED_NEGATIVES and "not" in (x, y):
            return None
        return Verdict(False, "substitution", f"{x!r} vs {y!r}")

    @staticmethod
    def _modifier(a: Features, b: Features) -> Verdict | None:
        """One question narrows the other with a single word added inside a phrase both
        share ("first president" vs "first vice president", "human cell" vs "human egg
        cell", "keys" vs "black keys"): it asks about a different thing, not the same one
        reworded. A word added before a function word ("steps to reset ...", "which
        currency do they use in ...") or a number is rewording, not narrowing."""
        short, long = sorted((a, b), key=lambda f: len(f.content))
        p, s = _frame(short.content, long.content)
        # Exactly one word added, before a shared one.
        if len(long.content) != len(short.content) + 1 or p + s != len(short.content) or not s:
            return None
        added, following = long.content[p], long.content[p + 1]
        # Only a modifier if it directly precedes that word in the text, and that is not a
        # number ("calculate 15% of 80", "convert 100 °F" only reword the request).
        adjacent = long.content_at[p + 1] == long.content_at[p] + 1
        # A hedge ("technically fruits") or a verb of asking ("define X") only rewords.
        rewording = long.words[long.content_at[p]] in lexicon.NON_NARROWING
        narrowing = added.replace("-", "").isalpha() and not following[:1].isdigit()
        if adjacent and narrowing and not rewording:
            return Verdict(False, "modifier", f"{added!r} added before {following!r}")
        return None

    @staticmethod
    def _qualifier(a: Features, b: Features) -> Verdict | None:
        """One question is the other with a condition or scope added ("... for a runny
        yolk" vs "... for a runny yolk at high altitude", "the deadline to file taxes in
        2025" vs "the deadline to file taxes with an extension in 2025"): the narrower
        question has its own answer. Only the whole question with a phrase inserted after
        its start, opened by a preposition or "while", "if", "and", counts; context
        restated in other words ("installing numpy on a windows pc") or a new clause
        ("iphone not charging, how to fix") does not."""
        short, long = sorted((a, b), key=lambda f: len(f.content))
        p, s = _frame(short.content, long.content)
        added = len(long.content) - len(short.content)
        if not p or not added or p + s != len(short.content):
            return None
        # A number added is the numbers rule's ("in a cup" vs "in 1 cup" is one cup).
        if any(word[:1].isdigit() for word in long.content[p : p + added]):
            return None
        start = long.content_at[p - 1] + 1  # just after the last shared word before it
        link = long.words[start : long.content_at[p]]
        # At the end, the phrase may open late ("bought during the holiday season"); inside
        # the question it opens at once ("the protein content of an egg" only rewords).
        opening = long.words[start : long.content_at[p + added - 1]] if not s else link
        if lexicon.QUESTION_WORDS & set(link) or not lexicon.QUALIFIER_OPENERS & set(opening):
            return None
        # The phrase may spell out a name the shorter question abbreviates ("first US
        # president" vs "first president of the United States").
        names = {w for w in short.words if lexicon.ENTITY_ALIASES.get(w, w) in short.entities}
        if _spelled_out(names, set(), long.words)[0] != names:
            return None
        phrase = long.words[start : long.content_at[p + added - 1] + 1]
        return Verdict(False, "qualifier", f"{' '.join(phrase)!r} on one side only")

    @staticmethod
    def _literal(a: Features, b: Features) -> Verdict | None:
        """Different quoted text ("how do you say 'I went'" vs "'I go'") or command-line
        flags ("-d" vs "--rm"): what the question operates on differs. Only when each side
        has words the other lacks: "'data'" vs "'data is' or 'data are'" asks the same."""
        for x, y, what in ((a.quoted, b.quoted, "quoted"), (a.flags, b.flags, "flags")):
            if x - y and y - x:
                return Verdict(False, "literal", f"{what} {_fmt(x)} vs {_fmt(y)}")
        return None

    @staticmethod
    def _contrast(a: Features, b: Features) -> Verdict | None:
        """A different member of a set of alternatives, or an audience on one side only."""
        exchanged = _exchange_verdict(a, b, CONTRASTS, "contrast")
        if exchanged is not None:
            return exchanged
        for group in AUDIENCES:
            named_a, named_b = sorted(a.stems & group), sorted(b.stems & group)
            if bool(named_a) != bool(named_b):
                return Verdict(
                    False, "contrast", f"for {(named_a or named_b)[0]!r} on one side only"
                )
        return None

    @staticmethod
    def _order(a: Features, b: Features) -> Verdict | None:
        """The same words in another order ("can dogs eat cat food" vs "can cats eat dog
        food"), a directed phrase reversed ("from English to French" vs the reverse), or
        the same numbers in another order where order matters ("10 minus 4")."""
        if (
            a.numbers != b.numbers
            and (a.noncommutative or b.noncommutative)
            and not _units_name_each_number(a, b)
        ):
            numbers = f"{_fmt(a.numbers)} vs {_fmt(b.numbers)}"
            return Verdict(False, "order", f"numbers in another order: {numbers}")
        if _swapped(a, b):
            return Verdict(False, "order", "two names or phrases trade places")
        for anchor, role in a.roles.items():
            other = b.roles.get(anchor)
            if other is not None and other != role:
                return Verdict(
                    False, "order", f"{anchor!r} is the {role} in one, the {other} in the other"
                )
        return None

    @staticmethod
    def _entities(a: Features, b: Features) -> Verdict | None:
        """A name swapped for another ("install numpy on windows" vs "on macos"). A name on
        one side only is usually added context ("what is sudo" vs "sudo in linux")."""
        only_a = {e for e in a.entities if not _mentions(b, e)}
        only_b = {e for e in b.entities if not _mentions(a, e)}
        only_a, only_b = _spelled_out(only_a, only_b, b.words)
        only_b, only_a = _spelled_out(only_b, only_a, a.words)
        # A kind of what the other names ("on Ubuntu" vs "on Linux") is no other name.
        only_a, only_b = (
            {e for e in only_a if lexicon.ENTITY_PARENTS.get(e) not in only_b},
            {e for e in only_b if lexicon.ENTITY_PARENTS.get(e) not in only_a},
        )
        if only_a and only_b:
            return Verdict(False, "entities", f"{_fmt(only_a)} vs {_fmt(only_b)}")
        return None

    @staticmethod
    def _question_type(a: Features, b: Features) -> Verdict | None:
        pair = frozenset({a.qtype, b.qtype})
        if len(pair) == 2 and "other" not in pair and pair not in lexicon.COMPATIBLE_QUESTION_TYPES:
            return Verdict(False, "question_type", f"{a.qtype} vs {b.qtype}")
        return None

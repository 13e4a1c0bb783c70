"""The near-miss guard: after a vector match, reject candidates whose answer would differ.

Sentence embeddings score "Convert 100 °F to Celsius" vs "Convert 100 °C to
Fahrenheit" at 0.99, above most true paraphrases. The guard compares the two
questions on the features that change an answer while barely moving the vector:
numbers, units, negation, opposite words, direction (A to B vs B to A), named
entities, contrasting alternatives, the kind of question, a word or short phrase
exchanged in the same frame (operators such as == and === included) and one word
added inside a shared phrase ("president" vs "vice president"). Each rule is a few
set operations over pre-extracted features, cached per text (extracting a new
question's takes ~0.5 ms once; a check then costs tens of microseconds), and a
rejection names its rule so the dry run can explain it.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from cache import lexicon


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
    r"|[^\W\d_]+(?:[.'\u2019+#-][^\W\d_0-9]+)*[+#]*"  # words: node.js, c++, c#, don't, e-mail
    r"|[^\W_]+",  # alphanumerics: python3, gpt4, 5g
    re.UNICODE | re.IGNORECASE,
)
_NUMERIC = re.compile(r"^\d+(?:[.,]\d+)*(?:st|nd|rd|th|k)?$")
_NUMBER_WITH_UNIT = re.compile(r"^(\d+(?:\.\d+)?)([a-z]+)$")


@dataclass(frozen=True)
class Features:
    words: tuple[str, ...]  # lower-cased tokens in order
    stems: frozenset[str]
    numbers: tuple[float, ...]  # in order of appearance
    units: tuple[str, ...]  # canonical units in order of appearance
    quantified_units: frozenset[str]  # units attached to a number
    content: tuple[str, ...]  # stems of the non-stopwords, in order
    negations: int
    entities: frozenset[str]  # canonical entity names
    roles: dict[str, str]  # anchor -> "src" | "dst" for directed phrases
    qtype: str
    noncommutative: bool
    particles: frozenset[tuple[str, str]]  # (verb stem, particle): ("turn", "on")


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
        num, den = token.split("/")
        return float(num) / float(den) if int(den) else None
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
    tokens: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(text):
        original = match.group()
        lower = original.lower().replace(" ", "")
        glued = _NUMBER_WITH_UNIT.match(lower)  # "100g" -> "100", "g"; "2fa" stays a name
        if glued and (glued[2] in lexicon.UNITS or glued[2] in lexicon.LETTER_UNITS):
            tokens += [(glued[1], glued[1]), (glued[2], glued[2])]
        else:
            tokens.append((original, lower))
    return tokens


def _numbers(words: list[str]) -> list[float]:
    values: list[float] = []
    previous_tens = previous_number = False
    for word in words:
        value = 1.0 if word == "k" else _number_value(word)
        if value is None:
            previous_tens = previous_number = False
            continue
        if word == "k" and previous_number and values:
            values[-1] *= 1000  # "300k", "401(k)"
        elif word in lexicon.MULTIPLIER_WORDS and values:
            values[-1] *= value  # "two hundred", "5 million"
        elif previous_tens and value < 10:
            values[-1] += value  # "twenty five"
        else:
            values.append(value)
        previous_tens = word in lexicon.TENS_WORDS
        previous_number = True
    # One is the unit quantity: "1 lb" and "a pound" ask the same thing.
    return [v for v in values if v != 1.0]


def _units(words: list[str]) -> tuple[list[str], set[str]]:
    """All units in order, and those that measure a stated number ("30 days")."""
    units: list[str] = []
    quantified: set[str] = set()
    numeric = [_number_value(w) is not None for w in words] + [False]
    for i, word in enumerate(words):
        after_number = i > 0 and numeric[i - 1]
        # "100 us dollars": one word may sit between a number and its unit.
        near_number = after_number or (i > 1 and numeric[i - 2])
        unit = lexicon.UNITS.get(word)
        # Bare letters (c, f, m, g, l, h, s) are units only right after a number.
        if unit is None and word in lexicon.LETTER_UNITS and after_number:
            unit = lexicon.LETTER_UNITS[word]
        if unit is not None:
            units.append(unit)
            if near_number or (word in lexicon.CURRENCY_SIGNS and numeric[i + 1]):
                quantified.add(unit)  # "30 days", "$20"
    return units, quantified


def _negations(words: list[str]) -> int:
    count = 0
    for word in words:
        if word in lexicon.NEGATIONS or word.endswith("n't"):
            count += 1
    return count


def _entities(tokens: list[tuple[str, str]], words: list[str]) -> set[str]:
    """Proper names and technical names: capitalised or mixed-case words not starting a
    sentence, acronyms, letter+digit names, and a gazetteer for names users type in
    lower case (countries, cities, languages, products). Aliases map to one name."""
    found: set[str] = set()
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
    """Direction of "A to B", "from A", "A than B": anchors (content words) get a source or
    destination role; an anchor seen in both roles is dropped as ambiguous."""
    roles: dict[str, set[str]] = {}

    def anchor(start: int, step: int, skip_comparatives: bool = False) -> str | None:
        i, seen = start, 0
        while 0 <= i < len(words) and seen < 4:
            word = words[i]
            if word in lexicon.CLAUSE_BREAKS:
                return None
            comparative = skip_comparatives and (
                word in lexicon.COMPARATIVE_WORDS or (word.endswith("er") and len(word) > 4)
            )
            if word not in lexicon.STOPWORDS and not comparative and _number_value(word) is None:
                return lexicon.UNITS.get(word) or lexicon.ENTITY_ALIASES.get(word) or stem(word)
            i += step
            seen += 1
        return None

    def mark(word: str | None, role: str) -> None:
        if word:
            roles.setdefault(word, set()).add(role)

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
        elif word in lexicon.DIRECTIONAL_TO and (has_from or lexicon.MOTION_WORDS & set(words)):
            if not has_from:
                mark(anchor(i - 1, -1), "src")
            mark(anchor(i + 1, 1), "dst")
        elif word == "than":
            mark(anchor(i - 1, -1, skip_comparatives=True), "src")
            mark(anchor(i + 1, 1), "dst")
    return {word: next(iter(r)) for word, r in roles.items() if len(r) == 1}


def _question_type(words: list[str]) -> str:
    """The type whose cue comes first ("when did the man who..." is a when-question)."""
    text = " ".join(words)
    best, best_at = "other", len(text) + 1
    for qtype, pattern in lexicon.QUESTION_TYPES:
        match = re.search(pattern, text)
        if match and match.start() < best_at:
            best, best_at = qtype, match.start()
    if best in {"count", "amount"} and lexicon.PRICE_WORDS & set(words):
        return "price"
    return best


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
# Longest phrase the substitution rule treats as exchanged inside a shared frame: more
# differing words than this is a reworded question rather than one slot refilled.
MAX_EXCHANGED = 3


@lru_cache(maxsize=8192)
def features(text: str) -> Features:
    tokens = _tokens(text)
    words = [_strip_possessive(lower) for _, lower in tokens]
    units, quantified = _units(words)
    return Features(
        words=tuple(words),
        stems=frozenset(stem(w) for w in words),
        numbers=tuple(_numbers(words)),
        units=tuple(units),
        quantified_units=frozenset(quantified),
        content=tuple(stem(w) for w in words if w not in lexicon.STOPWORDS),
        negations=_negations(words),
        entities=frozenset(_entities(tokens, words)),
        roles=_roles(words),
        qtype=_question_type(words),
        noncommutative=bool(lexicon.NONCOMMUTATIVE & set(words)) or "/" in text,
        particles=frozenset(
            (stem(v), p)
            for v, p in itertools.pairwise(words)
            if p in lexicon.OPPOSITE_PARTICLES and v not in lexicon.STOPWORDS
        ),
    )


def _fmt(values: object) -> str:
    if isinstance(values, tuple | list | set | frozenset):
        items = sorted(values) if isinstance(values, set | frozenset) else list(values)
        return "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in items) + "}"
    return str(values)


def _mentions(f: Features, entity: str) -> bool:
    if entity in f.entities:
        return True
    return all(part in f.words or stem(part) in f.stems for part in entity.split())


def _exchange_verdict(
    a: Features, b: Features, related: dict[str, set[str]], rule: str
) -> Verdict | None:
    """Rejects when a word only in `a` has its related word (antonym, alternative) only
    in `b`."""
    for x in a.stems - b.stems:
        for y in related.get(x, ()):
            if y in b.stems and y not in a.stems:
                return Verdict(False, rule, f"{x!r} vs {y!r}")
    return None


def _swapped(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Two non-adjacent content words trade places and everything else stays put. Moving a
    phrase ("the world's longest river" vs "the longest river in the world") or turning a
    compound around ("refund policy" vs "policy on refunds") is not a swap."""
    if len(a) != len(b) or sorted(a) != sorted(b):
        return False
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return len(diff) == 2 and diff[1] - diff[0] >= 2


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


def _same_word(x: str, y: str) -> bool:
    """One word up to inflection, hyphens or abbreviation (spider/spiders, e-mail/email,
    env/environment); operators and numbers are never "the same" as another."""
    x, y = x.replace("-", ""), y.replace("-", "")
    return x.isalpha() and y.isalpha() and (x.startswith(y) or y.startswith(x))


def _comparable_units(a: set[str], b: set[str]) -> tuple[set[str], set[str]]:
    """ "degrees" stands for whichever temperature scale the other question names."""
    temps = lexicon.TEMPERATURE_UNITS
    if "degree" in a and b & temps:
        a = (a - {"degree"}) | (b & temps)
    if "degree" in b and a & temps:
        b = (b - {"degree"}) | (a & temps)
    return a, b


class Guard:
    """`check(cached, query)` -> Verdict. Rules can be switched off by name."""

    RULES = (
        "numbers",
        "units",
        "negation",
        "polarity",
        "order",
        "entities",
        "contrast",
        "question_type",
        "substitution",
        "modifier",
    )

    def __init__(self, rules: tuple[str, ...] = RULES) -> None:
        unknown = set(rules) - set(self.RULES)
        if unknown:
            raise ValueError(f"unknown guard rules {sorted(unknown)}; known: {self.RULES}")
        self.rules = rules

    def check(self, cached: str, query: str) -> Verdict:
        if cached == query:
            return PASS
        a, b = features(cached), features(query)
        for rule in self.rules:
            verdict = getattr(self, f"_{rule}")(a, b)
            if verdict is not None:
                return verdict
        return PASS

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
        if ((ua - ub) and (ub - ua)) or (qa - ub) or (qb - ua):
            return Verdict(False, "units", f"{_fmt(ua)} vs {_fmt(ub)}")
        return None

    @staticmethod
    def _negation(a: Features, b: Features) -> Verdict | None:
        if a.negations % 2 != b.negations % 2:
            return Verdict(False, "negation", "one question is negated, the other is not")
        return None

    @staticmethod
    def _polarity(a: Features, b: Features) -> Verdict | None:
        opposed = _exchange_verdict(a, b, ANTONYMS, "polarity")
        if opposed is not None:
            return opposed
        for verb, particle in a.particles - b.particles:
            opposite = (verb, lexicon.OPPOSITE_PARTICLES[particle])
            if opposite in b.particles and opposite not in a.particles:
                return Verdict(False, "polarity", f"{verb!r} {particle} vs {opposite[1]}")
        return None

    @staticmethod
    def _substitution(a: Features, b: Features) -> Verdict | None:
        """The same question frame with a short phrase exchanged ("car insurance" vs "home
        insurance", "a hard yolk" vs "a runny yolk", "midnight sun" vs "northern lights")
        is nearly always a different question: true paraphrases reword the frame too, or
        swap a word for a synonym. The frame is the content words both questions share
        at the start and at the end; what differs between them is at most a few words
        on each side."""
        p, s = _frame(a.content, b.content)
        mid_a, mid_b = a.content[p : len(a.content) - s], b.content[p : len(b.content) - s]
        if not mid_a or not mid_b or max(len(mid_a), len(mid_b)) > MAX_EXCHANGED:
            return None
        # One word for one keeps any shared frame; a phrase needs at least two shared words.
        if p + s < (1 if len(mid_a) == len(mid_b) == 1 else 2) or set(mid_a) == set(mid_b):
            return None
        # A word and its own inflection or spelling (spider/spiders, medium-sized/medium
        # size, e-mail/email) are one word; operators are not (== vs ===).
        if _same_word("".join(mid_a), "".join(mid_b)):
            return None
        # Word for word synonyms or abbreviations ("early symptoms" vs "first signs",
        # "environment variables" vs "env vars") reword the same phrase.
        if len(mid_a) == len(mid_b) and all(
            _same_word(x, y) or y in SYNONYMS.get(x, ()) for x, y in zip(mid_a, mid_b, strict=True)
        ):
            return None
        return Verdict(False, "substitution", f"{' '.join(mid_a)!r} vs {' '.join(mid_b)!r}")

    @staticmethod
    def _modifier(a: Features, b: Features) -> Verdict | None:
        """One question narrows the other with a single word added inside a phrase both
        share ("first president" vs "first vice president", "human cell" vs "human egg
        cell"): it asks about a different thing, not the same one reworded. Words added
        at the start ("steps to reset ...") or before a function word ("which currency do
        they use in ...") are rewording, not narrowing."""
        (short, _), (long, words) = sorted(
            ((a.content, a.words), (b.content, b.words)), key=lambda f: len(f[0])
        )
        p, s = _frame(short, long)
        # Exactly one word added, inside: after one shared word and before another.
        if len(long) != len(short) + 1 or p + s != len(short) or not p or not s:
            return None
        added, following = long[p], long[p + 1]
        # Only a modifier if it directly precedes the next shared word.
        if added.isalpha() and any(
            stem(w) == added and stem(n) == following for w, n in itertools.pairwise(words)
        ):
            return Verdict(False, "modifier", f"{added!r} added before {following!r}")
        return None

    @staticmethod
    def _contrast(a: Features, b: Features) -> Verdict | None:
        return _exchange_verdict(a, b, CONTRASTS, "contrast")

    @staticmethod
    def _order(a: Features, b: Features) -> Verdict | None:
        """The same words in another order ("can dogs eat cat food" vs "can cats eat dog
        food"), a directed phrase reversed ("from English to French" vs the reverse), or
        the same numbers in another order where order matters ("10 minus 4")."""
        if a.numbers != b.numbers and (a.noncommutative or b.noncommutative):
            numbers = f"{_fmt(a.numbers)} vs {_fmt(b.numbers)}"
            return Verdict(False, "order", f"numbers in another order: {numbers}")
        if _swapped(a.content, b.content):
            return Verdict(False, "order", "two words trade places")
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
        only_a = sorted(e for e in a.entities if not _mentions(b, e))
        only_b = sorted(e for e in b.entities if not _mentions(a, e))
        if only_a and only_b:
            return Verdict(False, "entities", f"{_fmt(only_a)} vs {_fmt(only_b)}")
        return None

    @staticmethod
    def _question_type(a: Features, b: Features) -> Verdict | None:
        pair = frozenset({a.qtype, b.qtype})
        if len(pair) == 2 and "other" not in pair and pair not in lexicon.COMPATIBLE_QUESTION_TYPES:
            return Verdict(False, "question_type", f"{a.qtype} vs {b.qtype}")
        return None

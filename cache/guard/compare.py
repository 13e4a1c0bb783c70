"""How two questions' features relate, for the guard's rules: words that are one word
(inflections, spellings, synonyms, a name and its kind), opposites and alternatives, an
acronym spelled out, two phrases trading places, and the frame two word lists share."""

from __future__ import annotations

import itertools

from cache.guard import lexicon
from cache.guard.features import Features
from cache.guard.words import is_negation, stem


def _stem_map(pairs: list[tuple[str, str]]) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    for x, y in pairs:
        table.setdefault(stem(x), set()).add(stem(y))
        table.setdefault(stem(y), set()).add(stem(x))
    return table


def _group_pairs(groups: list[set[str]]) -> list[tuple[str, str]]:
    return [(x, y) for group in groups for x, y in itertools.combinations(sorted(group), 2)]


# The word lists by stem, as rules compare words: each word to its related ones, both ways.
ANTONYMS = _stem_map(lexicon.ANTONYM_PAIRS)
SYNONYMS = _stem_map(_group_pairs(lexicon.SYNONYM_GROUPS))
CONTRASTS = _stem_map(_group_pairs(lexicon.CONTRAST_GROUPS))
AUDIENCES = [frozenset(stem(w) for w in group) for group in lexicon.AUDIENCE_GROUPS]
IMPLIED_NEGATIVES = frozenset(stem(w) for w in lexicon.IMPLIED_NEGATIVES)
ENTITY_PARENT_STEMS = {stem(kind): stem(parent) for kind, parent in lexicon.ENTITY_PARENTS.items()}
# Longest phrase the order rule sees trading places ("Thomas Jefferson"): longer runs
# are clauses moved around, not two names swapped.
MAX_SWAPPED = 3


def mentions(f: Features, entity: str) -> bool:
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


def spelled_out(
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


def alike(x: str, y: str) -> bool:
    """The same word, up to inflection (annual/annually), two synonyms (kid/child), or a
    name and the kind it is (ubuntu/linux)."""
    return (
        x == y
        or _same_word(x, y)
        or y in SYNONYMS.get(x, ())
        or ENTITY_PARENT_STEMS.get(x) == y
        or ENTITY_PARENT_STEMS.get(y) == x
    )


def implied_negatives(f: Features) -> set[str]:
    """Verbs that carry a negation, unless negated themselves ("won't stop barking")."""
    return {
        stem(w)
        for i, w in enumerate(f.words)
        if stem(w) in IMPLIED_NEGATIVES and not (i and is_negation(f.words[i - 1]))
    }


def anchored_negations(f: Features, other: Features) -> int:
    """How many of f's negations negate a word the other question mentions."""
    said = [word for word in other.content if word != "not"]
    return sum(any(alike(w, s) for w in scope for s in said) for scope in f.negated)


def units_name_each_number(a: Features, b: Features) -> bool:
    """Reordering numbers says the same thing when each one is told apart by its unit
    ("$300,000 at 6% for 30 years" vs "a 30-year $300k loan at 6%"); numbers without
    one, or two of a unit, keep their order ("10 minus 4", "from 5 to 10 minutes")."""
    if sorted(a.measures, key=str) != sorted(b.measures, key=str):
        return False
    names = [unit for _, unit in a.measures]
    return len(set(names)) == len(names)  # at most one number without a unit


def swapped(a: Features, b: Features) -> bool:
    """Two names or phrases trade places and everything else stays put ("did Thomas
    Jefferson succeed John Adams" vs "did John Adams succeed Thomas Jefferson", "is a
    square a rectangle" vs "is a rectangle a square"). Moving a phrase ("the world's
    longest river" vs "the longest river in the world"), turning a compound around
    ("refund policy" vs "policy on refunds", "the equation for the combustion of methane"
    vs "the methane combustion equation") or the two sides of a symmetric operator
    ("17 times 23", "Venus or Serena") is not a swap."""
    if len(a.content) != len(b.content) or sorted(a.content) != sorted(b.content):
        return False
    p, s = frame(a.content, b.content)
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


def frame(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[int, int]:
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


def comparable_units(a: set[str], b: set[str]) -> tuple[set[str], set[str]]:
    """ "degrees" stands for whichever temperature scale the other question names."""
    temps = lexicon.TEMPERATURE_UNITS
    if "degree" in a and b & temps:
        a = (a - {"degree"}) | (b & temps)
    if "degree" in b and a & temps:
        b = (b - {"degree"}) | (a & temps)
    return a, b

"""The English guard's rules. Sentence embeddings score "Convert 100 °F to Celsius" vs
"Convert 100 °C to Fahrenheit" at 0.99, above most true paraphrases. The rules compare
the two questions on the features that change an answer while barely moving the vector:
numbers (a span of time in its largest whole unit: "14 days" is "2 weeks"), units,
negation, opposite words, before/during/after a time, direction (A to B vs B to A), two
names trading roles, named entities (acronyms match what they spell), contrasting
alternatives and an audience on one side only ("in children"), the kind of question,
one word exchanged in the same frame (operators such as == and === included), one word
added inside a shared phrase ("president" vs "vice president"), a condition added to a
whole question ("... while roaming"), different quoted text or flags, and what replaces
what ("A instead of B"). Each rule is a few set operations over pre-extracted features
(`features.py`, cached per text: extracting a new question's takes ~0.5 ms once; a check
then costs tens of microseconds), and a rejection names its rule so the dry run can
explain it.

The rules that are certain (a different number, unit, name, negation, direction, an
opposite word, quoted text or kind of question is never the same question) reject on
their own. The others (contrast, substitution, modifier, qualifier) mark the grey zone
(`GREY_RULES`), which the verifier decides (`english_guard.py`).

Each rule below is a function registered by `@rule` with an example pair it rejects
(tests/cache/guard/test_rules.py checks each); they run in the order they are defined
here. The word lists they read are in `guard_words.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from cache.guard import lexicon
from cache.guard.compare import (
    ANTONYMS,
    AUDIENCES,
    CONTRASTS,
    IMPLIED_NEGATIVES,
    alike,
    anchored_negations,
    comparable_units,
    frame,
    implied_negatives,
    mentions,
    spelled_out,
    swapped,
    units_name_each_number,
)
from cache.guard.features import Features
from cache.guard.verdict import Verdict, fmt
from cache.language import ENGLISH

WordCheck = Callable[[Features, Features], Verdict | None]
Check = TypeVar("Check", bound=WordCheck)


@dataclass(frozen=True)
class Rule:
    name: str
    example: tuple[str, str]  # a cached question and a query the rule rejects
    check: WordCheck
    certain: bool  # rejects on its own; else its finding is one of the verifier's features


# Every rule by name, in the order they run: the first to reject names the verdict.
REGISTRY: dict[str, Rule] = {}


def rule(example: tuple[str, str], certain: bool = True) -> Callable[[Check], Check]:
    """Registers the decorated function as the rule of its name, to run after those
    registered before it. Certain rules run before the grey zone's."""

    def register(check: Check) -> Check:
        name = check.__name__
        if name in REGISTRY:
            raise ValueError(f"guard rule {name!r} registered twice")
        if certain and any(not r.certain for r in REGISTRY.values()):
            raise ValueError(f"guard rule {name!r}: certain rules run before the grey zone's")
        REGISTRY[name] = Rule(name, example, check, certain)
        return check

    return register


@rule(example=("What is the capital of France?", "Quelle est la capitale de la France ?"))
def language(a: Features, b: Features) -> Verdict | None:
    """Every other rule reads English (its words, question types and phrases): a question
    in another language, or two questions in different languages (an answer in one does
    not serve an asker in the other), is never served a semantic hit; the exact tier
    still answers a question asked again word for word."""
    if a.language == b.language == ENGLISH:
        return None
    if a.language != b.language:
        return Verdict(False, "language", f"{a.language} vs {b.language}")
    return Verdict(False, "language", f"language {b.language} not supported")


@rule(example=("What is 17 times 23?", "What is 17 times 24?"))
def numbers(a: Features, b: Features) -> Verdict | None:
    """Different numbers, in any order ("17 times 23" vs "17 times 24")."""
    if sorted(a.numbers) != sorted(b.numbers):
        return Verdict(False, "numbers", f"{fmt(a.numbers)} vs {fmt(b.numbers)}")
    return None


@rule(example=("How many days in 30 weeks?", "How many days in 30 months?"))
def units(a: Features, b: Features) -> Verdict | None:
    """Different units when both name some, or a measured quantity whose unit the other
    question never mentions ("within 30 days" vs "within 30 weeks")."""
    ua, ub = comparable_units(set(a.units), set(b.units))
    qa, qb = comparable_units(set(a.quantified_units), set(b.quantified_units))
    # A currency sign on one side only is usually just left out ("300k" vs "$300,000").
    qa, qb = qa - lexicon.CURRENCY_UNITS, qb - lexicon.CURRENCY_UNITS
    if qa and qb and qa != qb:  # "100 km in miles" vs "100 miles in km"
        return Verdict(False, "units", f"{fmt(qa)} vs {fmt(qb)} measured")
    # "what is 15% of 80" states the percentage that "15 is what percent of 80" asks.
    for stated, asked in ((qa, b.asked_units), (qb, a.asked_units)):
        if stated & asked:
            return Verdict(False, "units", f"{fmt(stated & asked)} stated vs asked")
    if ((ua - ub) and (ub - ua)) or (qa - ub) or (qb - ua):
        return Verdict(False, "units", f"{fmt(ua)} vs {fmt(ub)}")
    return None


@rule(example=("Does the free plan include SSO?", "Doesn't the free plan include SSO?"))
def negation(a: Features, b: Features) -> Verdict | None:
    """One question negates what the other asks plainly ("a branch that has been
    merged" vs "hasn't been merged"). Only a negation of words the other question
    also uses counts: "not blank" for "non-empty", "didn't arrive" for "missing" say
    the same thing in other words."""
    if len(a.negated) % 2 == len(b.negated) % 2:
        return None
    count_a, count_b = anchored_negations(a, b), anchored_negations(b, a)
    if count_a % 2 == count_b % 2:
        return None
    # The other side may say it with a verb that carries the negation ("to not pay
    # the fee" vs "to avoid the fee"), as long as the negated side does not use it too.
    plain, negated = (a, b) if count_a % 2 == 0 else (b, a)
    if implied_negatives(plain) - negated.stems:
        return None
    return Verdict(False, "negation", "one question is negated, the other is not")


@rule(example=("How do I turn on roaming?", "How do I turn off roaming?"))
def polarity(a: Features, b: Features) -> Verdict | None:
    """Opposite words ("won" vs "lost"), before/during/after a stated time ("in the first
    2 days" vs "after"), or a verb's opposite particle ("turn on" vs "turn off")."""
    opposed = _exchange_verdict(a, b, ANTONYMS, "polarity")
    if opposed is not None:
        return opposed
    if a.timing and b.timing and not a.timing & b.timing:
        return Verdict(False, "polarity", f"{fmt(a.timing)} vs {fmt(b.timing)} a time")
    for verb, particle in a.particles - b.particles:
        opposite = (verb, lexicon.OPPOSITE_PARTICLES[particle])
        if opposite in b.particles and opposite not in a.particles:
            return Verdict(False, "polarity", f"{verb!r} {particle} vs {opposite[1]}")
    return None


@rule(example=("what is 10 minus 4", "what is 4 minus 10"))
def order(a: Features, b: Features) -> Verdict | None:
    """The same words in another order ("can dogs eat cat food" vs "can cats eat dog
    food"), a directed phrase reversed ("from English to French" vs the reverse), or
    the same numbers in another order where order matters ("10 minus 4")."""
    if (
        a.numbers != b.numbers
        and (a.noncommutative or b.noncommutative)
        and not units_name_each_number(a, b)
    ):
        numbers = f"{fmt(a.numbers)} vs {fmt(b.numbers)}"
        return Verdict(False, "order", f"numbers in another order: {numbers}")
    if swapped(a, b):
        return Verdict(False, "order", "two names or phrases trade places")
    for anchor, role in a.roles.items():
        other = b.roles.get(anchor)
        if other is not None and other != role:
            return Verdict(
                False, "order", f"{anchor!r} is the {role} in one, the {other} in the other"
            )
    return None


@rule(example=("how do i install numpy on windows", "how do i install numpy on macos"))
def entities(a: Features, b: Features) -> Verdict | None:
    """A name swapped for another ("install numpy on windows" vs "on macos"). A name on
    one side only is usually added context ("what is sudo" vs "sudo in linux")."""
    only_a = {e for e in a.entities if not mentions(b, e)}
    only_b = {e for e in b.entities if not mentions(a, e)}
    only_a, only_b = spelled_out(only_a, only_b, b.words)
    only_b, only_a = spelled_out(only_b, only_a, a.words)
    # A kind of what the other names ("on Ubuntu" vs "on Linux") is no other name.
    only_a, only_b = (
        {e for e in only_a if lexicon.ENTITY_PARENTS.get(e) not in only_b},
        {e for e in only_b if lexicon.ENTITY_PARENTS.get(e) not in only_a},
    )
    if only_a and only_b:
        return Verdict(False, "entities", f"{fmt(only_a)} vs {fmt(only_b)}")
    return None


@rule(example=("What does ls -a do?", "What does ls -l do?"))
def literal(a: Features, b: Features) -> Verdict | None:
    """Different quoted text ("how do you say 'I went'" vs "'I go'") or command-line
    flags ("-d" vs "--rm"): what the question operates on differs. Only when each side
    has words the other lacks: "'data'" vs "'data is' or 'data are'" asks the same."""
    for x, y, what in ((a.quoted, b.quoted, "quoted"), (a.flags, b.flags, "flags")):
        if x - y and y - x:
            return Verdict(False, "literal", f"{what} {fmt(x)} vs {fmt(y)}")
    return None


@rule(example=("When was Tesla founded?", "Who founded Tesla?"))
def question_type(a: Features, b: Features) -> Verdict | None:
    """Two kinds of question that ask for different answers ("when was X founded" vs "who
    founded X"); `guard_words.json` lists the kinds that may ask the same thing."""
    pair = frozenset({a.qtype, b.qtype})
    if len(pair) == 2 and "other" not in pair and pair not in lexicon.COMPATIBLE_QUESTION_TYPES:
        return Verdict(False, "question_type", f"{a.qtype} vs {b.qtype}")
    return None


@rule(example=("Best running plan for beginners", "Best running plan for experts"), certain=False)
def contrast(a: Features, b: Features) -> Verdict | None:
    """A different member of a set of alternatives, or an audience on one side only."""
    exchanged = _exchange_verdict(a, b, CONTRASTS, "contrast")
    if exchanged is not None:
        return exchanged
    for group in AUDIENCES:
        named_a, named_b = sorted(a.stems & group), sorted(b.stems & group)
        if bool(named_a) != bool(named_b):
            return Verdict(False, "contrast", f"for {(named_a or named_b)[0]!r} on one side only")
    return None


@rule(
    example=(
        "Does my car insurance cover hail damage?",
        "Does my home insurance cover hail damage?",
    ),
    certain=False,
)
def substitution(a: Features, b: Features) -> Verdict | None:
    """The same question frame with one word exchanged ("car insurance" vs "home
    insurance", "check my balance" vs "change my balance") is nearly always a
    different question: true paraphrases reword the frame too, or swap a word for a
    synonym. The frame is the content words both questions share at the start and
    at the end. Longer exchanges are left to the verifier: "the most" for "the
    maximum amount" is rewording, and its similarity says so."""
    p, s = frame(a.content, b.content)
    mid_a, mid_b = a.content[p : len(a.content) - s], b.content[p : len(b.content) - s]
    if len(mid_a) != 1 or len(mid_b) != 1 or p + s == 0:
        return None
    (x,), (y,) = mid_a, mid_b
    # A word and its own inflection or spelling (spider/spiders, e-mail/email), or a
    # synonym, is one word; operators are not (== vs ===).
    if alike(x, y):
        return None
    # A verb that carries the negation for "not" and a verb: "avoid" vs "not pay".
    if {x, y} & IMPLIED_NEGATIVES and "not" in (x, y):
        return None
    return Verdict(False, "substitution", f"{x!r} vs {y!r}")


@rule(
    example=("What is the salary of a nurse?", "What is the salary of a head nurse?"), certain=False
)
def modifier(a: Features, b: Features) -> Verdict | None:
    """One question narrows the other with a single word added inside a phrase both
    share ("first president" vs "first vice president", "human cell" vs "human egg
    cell", "keys" vs "black keys"): it asks about a different thing, not the same one
    reworded. A word added before a function word ("steps to reset ...", "which
    currency do they use in ...") or a number is rewording, not narrowing."""
    short, long = sorted((a, b), key=lambda f: len(f.content))
    p, s = frame(short.content, long.content)
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


@rule(example=("Can I take ibuprofen?", "Can I take ibuprofen while breastfeeding?"), certain=False)
def qualifier(a: Features, b: Features) -> Verdict | None:
    """One question is the other with a condition or scope added ("... for a runny
    yolk" vs "... for a runny yolk at high altitude", "the deadline to file taxes in
    2025" vs "the deadline to file taxes with an extension in 2025"): the narrower
    question has its own answer. Only the whole question with a phrase inserted after
    its start, opened by a preposition or "while", "if", "and", counts; context
    restated in other words ("installing numpy on a windows pc") or a new clause
    ("iphone not charging, how to fix") does not."""
    short, long = sorted((a, b), key=lambda f: len(f.content))
    p, s = frame(short.content, long.content)
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
    if spelled_out(names, set(), long.words)[0] != names:
        return None
    phrase = long.words[start : long.content_at[p + added - 1] + 1]
    return Verdict(False, "qualifier", f"{' '.join(phrase)!r} on one side only")


def _exchange_verdict(
    a: Features, b: Features, related: dict[str, set[str]], name: str
) -> Verdict | None:
    """Rejects when a word only in `a` has its related word (antonym, alternative) only
    in `b`, unless the two are one word or name the same thing ("kid" and "child")."""
    for x in a.stems - b.stems:
        for y in related.get(x, ()):
            if y in b.stems and y not in a.stems and not alike(x, y):
                return Verdict(False, name, f"{x!r} vs {y!r}")
    return None


# The grey zone's rules, whose findings are features of the verifier.
GREY_RULES = tuple(name for name, r in REGISTRY.items() if not r.certain)

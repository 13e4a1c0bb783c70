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
instead of B"). Each rule is a few set operations over pre-extracted features
(`guard_features.py`, cached per text: extracting a new question's takes ~0.5 ms once;
a check then costs tens of microseconds), and a rejection names its rule so the dry run
can explain it.

The rules that are certain (a different number, unit, name, negation, direction, an
opposite word, quoted text or kind of question is never the same question) reject on
their own. The others (contrast, substitution, modifier, qualifier) mark the grey
zone: with the embeddings' similarity, the verifier (`verifier.py`, fitted on the
labelled pairs) weighs what they found together with the similarity, the words the two
questions share and the cross-encoder's reading of the two side by side
(`cross_encoder.py`); without one, a grey rule rejects on its own too.

Each rule below is a function registered by `@rule` with an example pair it rejects
(tests/cache/guard/test_rules.py checks each); they run in the order they are defined
here. The word lists they read are in `guard_words.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

from cache.guard import cross_encoder, lexicon
from cache.guard.compare import (
    ANTONYMS,
    AUDIENCES,
    CONTRASTS,
    IMPLIED_NEGATIVES,
    SYNONYMS,
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
from cache.guard.features import Features, features, stem
from cache.guard.verifier import VERIFIERS, Verifier, overlap_features
from cache.language import ENGLISH


@dataclass(frozen=True)
class Verdict:
    ok: bool
    rule: str | None = None
    detail: str = ""


PASS = Verdict(True)

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
VERIFIER = "verifier"  # the name a verdict of the verifier carries
CROSS = "cross"  # the verifier's feature that is the cross-encoder's logit


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
        return Verdict(False, "numbers", f"{_fmt(a.numbers)} vs {_fmt(b.numbers)}")
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
        return Verdict(False, "units", f"{_fmt(qa)} vs {_fmt(qb)} measured")
    # "what is 15% of 80" states the percentage that "15 is what percent of 80" asks.
    for stated, asked in ((qa, b.asked_units), (qb, a.asked_units)):
        if stated & asked:
            return Verdict(False, "units", f"{_fmt(stated & asked)} stated vs asked")
    if ((ua - ub) and (ub - ua)) or (qa - ub) or (qb - ua):
        return Verdict(False, "units", f"{_fmt(ua)} vs {_fmt(ub)}")
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
        return Verdict(False, "polarity", f"{_fmt(a.timing)} vs {_fmt(b.timing)} a time")
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
        numbers = f"{_fmt(a.numbers)} vs {_fmt(b.numbers)}"
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
        return Verdict(False, "entities", f"{_fmt(only_a)} vs {_fmt(only_b)}")
    return None


@rule(example=("What does ls -a do?", "What does ls -l do?"))
def literal(a: Features, b: Features) -> Verdict | None:
    """Different quoted text ("how do you say 'I went'" vs "'I go'") or command-line
    flags ("-d" vs "--rm"): what the question operates on differs. Only when each side
    has words the other lacks: "'data'" vs "'data is' or 'data are'" asks the same."""
    for x, y, what in ((a.quoted, b.quoted, "quoted"), (a.flags, b.flags, "flags")):
        if x - y and y - x:
            return Verdict(False, "literal", f"{what} {_fmt(x)} vs {_fmt(y)}")
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


def _fmt(values: object) -> str:
    if isinstance(values, tuple | list | set | frozenset):
        items = sorted(values) if isinstance(values, set | frozenset) else list(values)
        return "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in items) + "}"
    return str(values)


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


GREY_RULES = tuple(name for name, r in REGISTRY.items() if not r.certain)


# Words that only frame a question ("explain", "define", "mean"): a question that adds one
# asks the same thing, and they do not count as content words the two do not share.
_FRAMING = frozenset(stem(w) for w in lexicon.NON_NARROWING) | lexicon.NON_NARROWING


def _answer_type(f: Features) -> int | None:
    """Where a noun naming the answer's kind follows "which"/"what" ("which city is ..."),
    if one does."""
    for i in range(1, len(f.words)):
        if f.words[i - 1] in ("which", "what") and f.words[i] in lexicon.ANSWER_TYPE_NOUNS:
            return i
    return None


def _same_words(ca: list[str], cb: list[str]) -> bool:
    """The same content words (stems), in order, each the other's or a listed synonym
    ("built" and "constructed"). Not `alike`'s looser kin: "button" is not "buttonhole",
    nor "linux" "ubuntu"."""
    return len(ca) == len(cb) and all(
        x == y or y in SYNONYMS.get(x, ()) for x, y in zip(ca, cb, strict=True)
    )


def pair_features(
    a: Features, b: Features, similarity: float, grey: Collection[str], cross: float
) -> dict[str, float]:
    """What the verifier weighs of a pair the certain rules passed: the similarity; the
    cross-encoder's logit (`cross`) that the two ask the same thing; whether
    the two have the same content words (framing words aside, synonyms alike) and, when
    not, how much of
    their wording they share (all words: in common, in the same order, as adjacent pairs;
    content words in common, whether each side has one the other lacks, a word exchanged,
    and how many one side adds; whether one is the other with words added, alone and
    scaled by the similarity): a pair that keeps most words but changes one is another
    question more often than not, one that keeps every content word is rewording; and
    which grey rules found something (`grey`), alone and scaled by the similarity (a
    synonym exchanged scores higher than another thing named)."""
    ta, tb = _answer_type(a), _answer_type(b)
    # Only one side naming the answer's kind ("which city" beside "what") asks the same;
    # two kinds named are compared as content ("which city" vs "which country").
    ca = [
        w
        for i, w in zip(a.content_at, a.content, strict=True)
        if w not in _FRAMING and (i != ta or tb is not None)
    ]
    cb = [
        w
        for i, w in zip(b.content_at, b.content, strict=True)
        if w not in _FRAMING and (i != tb or ta is not None)
    ]
    differs = float(not _same_words(ca, cb))
    shared = overlap_features(a.words, b.words)
    only = (len(set(ca) - set(cb)), len(set(cb) - set(ca)))
    union = set(ca) | set(cb)
    # One question is the other with words added ("the health benefits of ..."): how
    # much such an addition matters depends on the similarity more than on the wording.
    inserted = differs * float(_within(a.words, b.words) or _within(b.words, a.words))
    values = {
        "similarity": similarity,
        CROSS: _clipped(cross),
        "same_content": 1.0 - differs,
        **{name: value * differs for name, value in shared.items()},
        "content_jaccard": differs * (len(set(ca) & set(cb)) / len(union) if union else 1.0),
        "exchanged": float(min(only) > 0),
        "added": float(max(only)),
        "similarity_x_sequence": similarity * shared["sequence"] * differs,
        "inserted": inserted,
        "inserted_x_similarity": inserted * similarity,
    }
    for name in GREY_RULES:
        found = float(name in grey)
        values[name] = found
        values[f"{name}_x_similarity"] = found * similarity
    return values


def _clipped(logit: float) -> float:
    return max(-cross_encoder.BOUND, min(cross_encoder.BOUND, logit))


def _within(short: Sequence[str], long: Sequence[str]) -> bool:
    """Whether `short` is `long` with words left out (a subsequence, in order)."""
    rest = iter(long)
    return len(short) < len(long) and all(w in rest for w in short)


@dataclass(frozen=True)
class Evidence:
    """What the rules found of a pair: the certain rule that rejects it (if any), and
    the grey rules' findings."""

    a: Features
    b: Features
    certain: Verdict | None
    grey: tuple[Verdict, ...]


class Guard:
    """`check(cached, query, similarity)` -> Verdict. Rules can be switched off by name.
    A check the verifier decides may run the cross-encoder (15-19 ms on one thread, on its
    worker): call it off the event loop. Without a `cross`, the shipped cross-encoder is
    loaded on first use (or by `load`)."""

    RULES = tuple(REGISTRY)  # the rules' names, in the order they run

    def __init__(
        self,
        rules: tuple[str, ...] = RULES,
        verifier: Verifier = VERIFIERS["english"],
        cross: cross_encoder.CrossEncoder | None = None,
    ) -> None:
        unknown = set(rules) - set(self.RULES)
        if unknown:
            raise ValueError(f"unknown guard rules {sorted(unknown)}; known: {self.RULES}")
        self.rules = rules
        self.verifier = verifier
        self._reads_cross = CROSS in verifier.features
        self._cross = cross
        chosen = [REGISTRY[name] for name in rules]
        self._certain = tuple(r.check for r in chosen if r.certain)
        self._grey = tuple(r.check for r in chosen if not r.certain)

    @property
    def cross(self) -> cross_encoder.CrossEncoder:
        if self._cross is None:
            self._cross = cross_encoder.shared()
        return self._cross

    def load(self) -> None:
        """Loads the cross-encoder now if the verifier reads it (a second or so), so the
        first check does not, inside some lookup's time budget."""
        if self._reads_cross and self._cross is None:
            self._cross = cross_encoder.shared()

    def evidence(self, cached: str, query: str) -> Evidence:
        a, b = features(cached), features(query)
        for check in self._certain:
            verdict = check(a, b)
            if verdict is not None:
                return Evidence(a, b, verdict, ())
        found = (check(a, b) for check in self._grey)
        return Evidence(a, b, None, tuple(v for v in found if v is not None))

    def check(self, cached: str, query: str, similarity: float | None = None) -> Verdict:
        """The verdict on serving `cached`'s answer to `query`. With their embeddings'
        `similarity`, the verifier decides what the certain rules pass; without, the
        grey rules reject on their own too."""
        if cached == query:
            return PASS
        evidence = self.evidence(cached, query)
        if evidence.certain is not None:
            return evidence.certain
        if similarity is None:
            return evidence.grey[0] if evidence.grey else PASS
        grey = {v.rule for v in evidence.grey if v.rule}
        values = pair_features(evidence.a, evidence.b, similarity, grey, 0.0)
        # The cross-encoder runs only when its logit can change the answer: about half of
        # the pairs a verifier decides are settled by the other features whatever it says.
        bound = cross_encoder.BOUND
        settled = None
        if self._reads_cross:
            settled = self.verifier.settled(values, CROSS, -bound, bound)
            if settled is None:
                values[CROSS] = _clipped(self.cross.score(cached, query))
        if settled is None:
            probability = self.verifier.probability(values)
            settled = probability >= self.verifier.cut
            why = f"probability {probability:.2f} < {self.verifier.cut:.2f} at similarity "
            why += f"{similarity:.3f}" + (
                f", cross-encoder {values[CROSS]:+.1f}" if self._reads_cross else ""
            )
        else:
            why = f"probability < {self.verifier.cut:.2f} at similarity {similarity:.3f}"
            why += " whatever the cross-encoder says"
        if settled:
            return PASS
        found = "; ".join(f"{v.rule}: {v.detail}" for v in evidence.grey)
        return Verdict(False, VERIFIER, why + (f" ({found})" if found else ""))

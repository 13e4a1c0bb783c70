"""The guard of the multilingual tier: checks that hold in any language, then the
verifier's multilingual model.

The certain checks (`language_features.py` extracts what they compare): both questions
in the same language; the same numbers (digits, number words, Chinese numerals), each
measuring the same thing ("20 miles en kilomètres" vs "20 kilomètres en miles"); the
same days where both name one ("hoy" vs "mañana"); the same quoted text where both
quote some ("《三国演义》" vs "《水浒传》"); no name on each side that the other lacks
(capitalised words, Latin-script names in another script); negated alike (per-language
word lists); no listed opposite said where the other says its counterpart (включить /
отключить, 打开 / 关闭); and, where both ask with a question word, the same kind of
answer (a person, a time, a place, a reason). The verifier then weighs the multilingual
embedder's similarity against how much wording the two share: a question that keeps
every word but one is another question more often than not ("上海有多少人口" vs
"深圳有多少人口"), while a paraphrase rewords. A language has its own similarity
threshold below which nothing is served (`Verifier.thresholds`); a language without one
has no semantic tier.
"""

from __future__ import annotations

from cache.guard.language_features import (
    DAYS,
    OPPOSITES,
    UNSPACED,
    LanguageFeatures,
    language_features,
)
from cache.guard.verdict import PASS, VERIFIER, Verdict, fmt
from cache.guard.verifier import VERIFIERS, Verifier, overlap_features
from cache.language import language


def certain(a: LanguageFeatures, b: LanguageFeatures) -> Verdict | None:
    """The first certain check that tells the two questions apart, if any."""
    if a.language != b.language:
        return Verdict(False, "language", f"{a.language} vs {b.language}")
    if a.numbers != b.numbers:
        return Verdict(False, "numbers", f"{fmt(a.numbers)} vs {fmt(b.numbers)}")
    units = {n for n in a.measured.keys() & b.measured.keys() if a.measured[n] != b.measured[n]}
    if units:
        n = min(units)
        return Verdict(False, "units", f"{n:g} {a.measured[n]}... vs {n:g} {b.measured[n]}...")
    if a.days and b.days and a.days != b.days:
        return Verdict(False, "days", f"{_day_names(a)} vs {_day_names(b)}")
    if a.quoted and b.quoted and a.quoted != b.quoted:
        return Verdict(False, "literal", f"quoted {fmt(a.quoted)} vs {fmt(b.quoted)}")
    only_a = {n for n in a.names if not b.mentions(n)}
    only_b = {n for n in b.names if not a.mentions(n)}
    if only_a and only_b:
        return Verdict(False, "entities", f"{fmt(only_a)} vs {fmt(only_b)}")
    if a.negations % 2 != b.negations % 2:
        return Verdict(False, "negation", "one question is negated, the other is not")
    flipped = min(((i, side) for i, side in a.opposites if (i, 1 - side) in b.opposites),
                  default=None)  # fmt: skip
    if flipped is not None:
        i, side = flipped
        said, other = OPPOSITES[a.language][i][side], OPPOSITES[a.language][i][1 - side]
        return Verdict(False, "opposites", f"{_first(said)}... vs {_first(other)}...")
    if a.asks and b.asks and a.asks != b.asks:
        return Verdict(False, "question_type", f"{a.asks} vs {b.asks}")
    return None


def pair_features(a: LanguageFeatures, b: LanguageFeatures, similarity: float) -> dict[str, float]:
    """What the verifier weighs: the similarity, and the wording the two share (as words,
    or characters where words are not spaced; and as pairs of characters)."""
    unspaced = a.language in UNSPACED
    units_a = a.text if unspaced else tuple(sorted(a.words))
    units_b = b.text if unspaced else tuple(sorted(b.words))
    words = overlap_features(units_a, units_b)
    characters = overlap_features(a.text, b.text)
    return {
        "similarity": similarity,
        "jaccard": words["jaccard"],
        "character_sequence": characters["sequence"],
        "character_bigrams": characters["bigrams"],
        "similarity_x_sequence": similarity * characters["sequence"],
    }


def _day_names(f: LanguageFeatures) -> str:
    return "{" + ", ".join(_first(DAYS[f.language][i]) for i in sorted(f.days)) + "}"


def _first(listed: tuple[str, ...]) -> str:
    """The first way a word list writes a word (a trailing "$", whole word, left off)."""
    return listed[0].rstrip("$")


class LanguageGuard:
    """`check(cached, query, similarity)` -> Verdict, for questions in a language the
    verifier has a threshold for."""

    def __init__(self, verifier: Verifier = VERIFIERS["multilingual"]) -> None:
        self.verifier = verifier

    @property
    def languages(self) -> frozenset[str]:
        return frozenset(self.verifier.thresholds)

    def evidence(self, cached: str, query: str) -> tuple[LanguageFeatures, LanguageFeatures]:
        return (
            language_features(cached, language(cached)),
            language_features(query, language(query)),
        )

    def check(self, cached: str, query: str, similarity: float | None = None) -> Verdict:
        if cached == query:
            return PASS
        a, b = self.evidence(cached, query)
        verdict = certain(a, b)
        if verdict is not None:
            return verdict
        threshold = self.verifier.thresholds.get(b.language)
        if threshold is None:
            return Verdict(False, "language", f"language {b.language} not fitted")
        if similarity is None:
            return PASS
        if similarity < threshold:
            return Verdict(
                False,
                "threshold",
                f"similarity {similarity:.3f} < {threshold:.3f}, {b.language}'s threshold",
            )
        probability = self.verifier.probability(pair_features(a, b, similarity))
        if probability >= self.verifier.cut:
            return PASS
        return Verdict(
            False,
            VERIFIER,
            f"probability {probability:.2f} < {self.verifier.cut:.2f} at similarity "
            f"{similarity:.3f}",
        )

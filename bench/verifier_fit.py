"""Fits the verifier (`cache/guard/verifier.py`) to labelled pairs, and scores it pair by pair.

Each pair is measured once: its similarity under its tier's embedder, whether a certain
rule rejects it, and the verifier's features. The English model is fitted on the pairs
of the English sets that the certain rules pass at or above the floor (the default
threshold); the multilingual model on the multilingual sets' pairs in one language that
the checks of any language pass at or above that language's threshold. A language's
threshold is the similarity that keeps `KEPT_PARAPHRASES` of its paraphrases in the fit
sets (rounded down to 0.01), for languages with at least `MIN_PARAPHRASES` of them: the
others have no semantic tier. Each model is a logistic regression cut at the lowest
probability where the fitted pairs still reach the target precision.

`held_out` fits on every file but one and scores that one, file by file: those are the
numbers to trust, as each file was written apart from the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.calibrate import Pair
from bench.embedding_cache import embed_cached
from cache.embedder import Embedder
from cache.guard import Guard
from cache.guard.language_features import language_features
from cache.guard.language_guard import certain
from cache.guard.language_guard import pair_features as language_pair_features
from cache.guard.pair_features import pair_features
from cache.guard.verifier import Verifier
from cache.language import ENGLISH, language
from cache.multilingual_embedder import MultilingualEmbedder

KEPT_PARAPHRASES = 0.9
MIN_PARAPHRASES = 5
# A large C: a dozen features and thousands of pairs need little shrinking.
C = 10.0


@dataclass(frozen=True)
class MeasuredPair:
    label: int
    language: str  # the query's
    similarity: float
    certain_rule: str | None  # the certain rule that rejects it, if any
    features: dict[str, float]


@dataclass(frozen=True)
class PairScore:
    precision: float
    recall: float
    hits: int
    false_hits: int
    paraphrases: int


@dataclass(frozen=True)
class HeldOutScore:
    name: str
    score: PairScore


def measure_english(
    pairs: Sequence[Pair],
    embedder: Embedder,
    guard: Guard,
    held_out: Sequence[float] | None = None,
) -> list[MeasuredPair]:
    """The pairs' English measures. The `cross` feature is the guard's cross-encoder's
    logit, or for a fit set the `held_out` logits its adapter file keeps
    (`bench.cross_encoder_fit.read_held_out`), which the verifier is fitted on."""
    texts = list(dict.fromkeys(t for p in pairs for t in (p.cached, p.query)))
    vectors = dict(zip(texts, embed_cached(embedder, texts), strict=True))
    evidence = [guard.evidence(p.cached, p.query) for p in pairs]
    if held_out is not None:
        cross = {(p.cached, p.query): x for p, x in zip(pairs, held_out, strict=True)}
    else:
        # Only the pairs the certain rules pass: no other is decided.
        passed = [
            (p.cached, p.query) for p, e in zip(pairs, evidence, strict=True) if e.certain is None
        ]
        cross = dict(zip(passed, guard.cross.score_many(passed), strict=True))
    rows = []
    for p, e in zip(pairs, evidence, strict=True):
        similarity = float(np.dot(vectors[p.cached], vectors[p.query]))
        grey = {v.rule for v in e.grey if v.rule}
        rows.append(
            MeasuredPair(
                label=p.label,
                language=e.b.language,
                similarity=similarity,
                certain_rule=None if e.certain is None else e.certain.rule,
                features=pair_features(
                    e.a, e.b, similarity, grey, cross.get((p.cached, p.query), 0.0)
                ),
            )
        )
    return rows


def measure_multilingual(
    pairs: Sequence[Pair], embedder: MultilingualEmbedder
) -> list[MeasuredPair]:
    texts = list(dict.fromkeys(t for p in pairs for t in (p.cached, p.query)))
    vectors = dict(zip(texts, embedder.embed_many(texts), strict=True))
    rows = []
    for p in pairs:
        similarity = float(np.dot(vectors[p.cached], vectors[p.query]))
        a = language_features(p.cached, language(p.cached))
        b = language_features(p.query, language(p.query))
        found = certain(a, b)
        if found is None and b.language == ENGLISH:
            found_rule: str | None = "language"  # English is the English tier's
        else:
            found_rule = None if found is None else found.rule
        rows.append(
            MeasuredPair(
                label=p.label,
                language=b.language,
                similarity=similarity,
                certain_rule=found_rule,
                features=language_pair_features(a, b, similarity),
            )
        )
    return rows


def language_thresholds(rows: Sequence[MeasuredPair]) -> dict[str, float]:
    """Each language's threshold: the similarity that keeps KEPT_PARAPHRASES of its
    paraphrases that the certain checks pass."""
    by_language: dict[str, list[float]] = {}
    for r in rows:
        if r.label == 1 and r.certain_rule is None:
            by_language.setdefault(r.language, []).append(r.similarity)
    return {
        lang: math.floor(float(np.quantile(sims, 1 - KEPT_PARAPHRASES)) * 100) / 100
        for lang, sims in sorted(by_language.items())
        if len(sims) >= MIN_PARAPHRASES
    }


def _floor(r: MeasuredPair, floor: float | dict[str, float]) -> float | None:
    return floor.get(r.language) if isinstance(floor, dict) else floor


def _decided(rows: Sequence[MeasuredPair], floor: float | dict[str, float]) -> list[MeasuredPair]:
    """The pairs the verifier decides: passed by the certain rules, at or above the floor."""
    out = []
    for r in rows:
        least = _floor(r, floor)
        if r.certain_rule is None and least is not None and r.similarity >= least:
            out.append(r)
    return out


def fit(
    rows: Sequence[MeasuredPair],
    floor: float | dict[str, float],
    target_precision: float,
    features: Sequence[str],
) -> Verifier:
    from sklearn.linear_model import LogisticRegression

    decided = _decided(rows, floor)
    labels = np.array([r.label for r in decided])
    if len(set(labels.tolist())) < 2:
        raise ValueError("fitting the verifier needs decided pairs of both labels")
    x = np.array([[r.features[f] for f in features] for r in decided])
    model = LogisticRegression(C=C, max_iter=20_000).fit(x, labels)
    probability = model.predict_proba(x)[:, 1]
    correct, cut = 0, None
    for rank, i in enumerate(np.argsort(-probability), 1):
        correct += labels[i]
        if correct / rank >= target_precision:
            cut = float(probability[i])
    if cut is None:
        raise ValueError(f"no cut of these pairs reaches precision {target_precision}")
    return Verifier(
        tuple(features),
        tuple(float(w) for w in model.coef_[0]),
        float(model.intercept_[0]),
        cut,
        dict(floor) if isinstance(floor, dict) else {},
    )


def score_pairs(
    rows: Sequence[MeasuredPair], floor: float | dict[str, float], verifier: Verifier
) -> PairScore:
    served = [r for r in _decided(rows, floor) if verifier.admits(r.features)]
    correct = sum(r.label for r in served)
    paraphrases = sum(r.label for r in rows)
    return PairScore(
        precision=correct / len(served) if served else 1.0,
        recall=correct / paraphrases if paraphrases else 0.0,
        hits=len(served),
        false_hits=len(served) - correct,
        paraphrases=paraphrases,
    )


def held_out(
    files: dict[str, list[MeasuredPair]],
    floor: float | None,
    target_precision: float,
    features: Sequence[str],
) -> list[HeldOutScore]:
    """Each file scored by the verifier fitted on the others (and, for the multilingual
    model, `floor` None: the thresholds fitted on the others)."""
    scores = []
    for name, rows in files.items():
        rest = [r for other, rs in files.items() if other != name for r in rs]
        least = language_thresholds(rest) if floor is None else floor
        verifier = fit(rest, least, target_precision, features)
        scores.append(HeldOutScore(name, score_pairs(rows, least, verifier)))
    return scores


def verifier_file(verifiers: dict[str, Verifier], fitted_on: dict[str, object]) -> str:
    """The JSON `verifier.read_verifiers` reads: each tier's model, and the fit's inputs."""
    tiers = {name: v.to_dict() for name, v in verifiers.items()}
    return json.dumps({"tiers": tiers, "fitted_on": fitted_on}, indent=2, ensure_ascii=False) + "\n"

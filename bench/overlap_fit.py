"""Fits the overlap bar (`overlap.py`) to labelled pairs, and scores it on held-out files.

Each pair is measured once: its similarity under the cache's embedder, its word
overlap, and whether the guard's other rules pass it. The fit sees only pairs a
cache could serve (similarity at or above the floor, other rules passed): a
logistic regression of the label on (similarity, jaccard, sequence), cut at the
lowest probability where the fitted pairs' precision still reaches the target, then
solved for the similarity that probability needs.

`held_out` fits on every file but one and scores that one, file by file: those are
the numbers to trust, as each file was written apart from the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bench.calibrate import Pair
from bench.embedding_cache import embed_cached
from cache.embedder import Embedder
from cache.guard import Guard, features, weighed_overlap
from cache.overlap import DEFAULT_CEILING, OverlapBar, WordOverlap


@dataclass(frozen=True)
class MeasuredPair:
    label: int
    similarity: float
    overlap: WordOverlap | None  # None: the same content words, which the bar passes
    other_rules_pass: bool


@dataclass(frozen=True)
class PairScore:
    precision: float
    recall: float
    false_hits: int


@dataclass(frozen=True)
class HeldOutScore:
    name: str
    without_bar: PairScore
    with_bar: PairScore


def measure(pairs: Sequence[Pair], embedder: Embedder, guard: Guard) -> list[MeasuredPair]:
    texts = list(dict.fromkeys(t for p in pairs for t in (p.cached, p.query)))
    vectors = dict(zip(texts, embed_cached(embedder, texts), strict=True))
    return [
        MeasuredPair(
            label=p.label,
            similarity=float(np.dot(vectors[p.cached], vectors[p.query])),
            overlap=weighed_overlap(features(p.cached), features(p.query)),
            other_rules_pass=guard.check(p.cached, p.query).ok,
        )
        for p in pairs
    ]


def _servable(rows: Sequence[MeasuredPair], floor: float) -> list[MeasuredPair]:
    return [r for r in rows if r.similarity >= floor and r.other_rules_pass]


def fit_bar(
    rows: Sequence[MeasuredPair],
    floor: float,
    target_precision: float,
    ceiling: float = DEFAULT_CEILING,
) -> OverlapBar:
    from sklearn.linear_model import LogisticRegression

    # The pairs the bar decides: servable, and not with the same content words.
    weighed = [(r.label, r.similarity, r.overlap) for r in _servable(rows, floor) if r.overlap]
    labels = np.array([label for label, _, _ in weighed])
    if len(set(labels)) < 2:
        raise ValueError("fitting the overlap bar needs servable pairs of both labels")
    x = np.array([[similarity, o.jaccard, o.sequence] for _, similarity, o in weighed])
    # A large C: three features and hundreds of pairs need no shrinking, and shrinking
    # would bias the similarity weight that the bar divides by.
    model = LogisticRegression(C=100.0, max_iter=10_000).fit(x, labels)
    probability = model.predict_proba(x)[:, 1]
    correct, cut = 0, None
    for rank, i in enumerate(np.argsort(-probability), 1):
        correct += labels[i]
        if correct / rank >= target_precision:
            cut = float(probability[i])
    if cut is None or cut >= 1.0:
        raise ValueError(f"no cut of these pairs reaches precision {target_precision}")
    w_similarity, w_jaccard, w_sequence = model.coef_[0]
    if w_similarity <= 0:
        raise ValueError("similarity does not raise the odds of a paraphrase on these pairs")
    logit = math.log(cut / (1 - cut))
    return OverlapBar(
        base=round(float((logit - model.intercept_[0]) / w_similarity), 3),
        per_jaccard=round(float(-w_jaccard / w_similarity), 3),
        per_sequence=round(float(-w_sequence / w_similarity), 3),
        ceiling=ceiling,
    )


def bar_file(bar: OverlapBar, floor: float, target_precision: float, pairs: Sequence[str]) -> str:
    """The JSON `overlap.read_bar` reads: the bar, and the inputs of the fit that gave it."""
    fitted_on = {"pairs": list(pairs), "floor": floor, "target_precision": target_precision}
    return json.dumps({"bar": asdict(bar), "fitted_on": fitted_on}, indent=2) + "\n"


def score_pairs(rows: Sequence[MeasuredPair], floor: float, bar: OverlapBar | None) -> PairScore:
    served = [
        r for r in _servable(rows, floor) if bar is None or bar.admits(r.similarity, r.overlap)
    ]
    correct = sum(r.label for r in served)
    paraphrases = sum(r.label for r in rows)
    return PairScore(
        precision=correct / len(served) if served else 1.0,
        recall=correct / paraphrases if paraphrases else 0.0,
        false_hits=len(served) - correct,
    )


def held_out(
    files: dict[str, list[MeasuredPair]],
    floor: float,
    target_precision: float,
    ceiling: float = DEFAULT_CEILING,
) -> list[HeldOutScore]:
    scores = []
    for name, rows in files.items():
        rest = [r for other, rs in files.items() if other != name for r in rs]
        bar = fit_bar(rest, floor, target_precision, ceiling)
        scores.append(
            HeldOutScore(name, score_pairs(rows, floor, None), score_pairs(rows, floor, bar))
        )
    return scores

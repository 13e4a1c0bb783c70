"""Calibration: labelled pairs in; precision, recall and a recommended threshold out.

Every distinct `cached` prompt is seeded into a fresh scope and every distinct
`query` is looked up against all of them (a dry run through the real store, so a
query can also be served a *different* cached prompt, as in production). A
served answer is correct only if (served prompt, query) is labelled 1, and wrong if
labelled 0. Any other hit (a query served another question of the set that no pair
relates to it) is unjudged: `precision` leaves it out, as the labels say nothing,
and `precision_all_hits` counts it wrong. Read on the labelled sets, most such hits
were wrong answers (26 of 36 with the guard of dd46137: "Which planet is closest to
the sun?" served to "What is the smallest planet?"; the rest were a question that
another pair of the set asks again), so a guard change that raises them is a loss
`precision` alone does not show.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from cache.policy import CacheRequest
from cache.semantic_cache import SemanticCache
from cache.thresholds import validate_threshold
from cache.tiers import CheckedCandidate

CURVE = tuple(round(0.5 + 0.025 * i, 3) for i in range(21))  # 0.50, 0.525, ..., 1.00


@dataclass(frozen=True)
class Pair:
    cached: str
    query: str
    label: int


@dataclass(frozen=True)
class Score:
    threshold: float
    precision: float
    recall: float
    hits: int
    false_hits: int
    unjudged_hits: int
    precision_all_hits: float  # unjudged hits counted wrong


class Judgements:
    """Paraphrase groups (union-find over label-1 pairs) and the label-0 pairs."""

    def __init__(self, pairs: list[Pair]) -> None:
        self._parent: dict[str, str] = {}
        for p in pairs:
            if p.label == 1:
                self._union(p.cached, p.query)
        self._negatives = {
            frozenset((self._find(p.cached), self._find(p.query))) for p in pairs if p.label == 0
        }

    def _find(self, text: str) -> str:
        self._parent.setdefault(text, text)
        while self._parent[text] != text:
            self._parent[text] = self._parent[self._parent[text]]
            text = self._parent[text]
        return text

    def _union(self, a: str, b: str) -> None:
        self._parent[self._find(a)] = self._find(b)

    def judge(self, served: str, query: str) -> bool | None:
        """True: a correct answer; False: a wrong one; None: the pairs do not say."""
        a, b = self._find(served), self._find(query)
        if a == b:
            return True
        if frozenset((a, b)) in self._negatives:
            return False
        return None


@dataclass(frozen=True)
class CalibrationReport:
    pairs: int
    queries: int
    answerable: int  # queries with at least one correct cached prompt
    threshold: float
    with_guard: Score
    without_guard: Score
    curve_with_guard: list[Score]
    curve_without_guard: list[Score]
    target_precision: float
    recommended_threshold: float | None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def load_pairs(path: Path) -> list[Pair]:
    pairs: list[Pair] = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read pairs file {path}: {exc.strerror}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pair = Pair(str(row["cached"]), str(row["query"]), int(row["label"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f'{path}:{n}: expected {{"cached": str, "query": str, "label": 0|1}}: {exc}'
            ) from exc
        if pair.label not in (0, 1) or not pair.cached.strip() or not pair.query.strip():
            raise ValueError(f"{path}:{n}: label must be 0 or 1 and texts non-empty")
        pairs.append(pair)
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs


def _served(
    candidates: list[CheckedCandidate], threshold: float, guard: bool
) -> CheckedCandidate | None:
    for c in candidates:
        passed = c.verdict is not None and c.verdict.ok  # dry runs check every candidate
        if c.candidate.similarity >= threshold and (passed or not guard):
            return c
    return None


def score(
    results: dict[str, list[CheckedCandidate]],
    judgements: Judgements,
    answerable: int,
    threshold: float,
    guard: bool,
) -> Score:
    hits = correct = wrong = 0
    for query, candidates in results.items():
        served = _served(candidates, threshold, guard)
        if served is None:
            continue
        hits += 1
        verdict = judgements.judge(served.candidate.entry.prompt, query)
        correct += verdict is True
        wrong += verdict is False
    return Score(
        threshold=threshold,
        precision=correct / (correct + wrong) if correct + wrong else 1.0,
        recall=correct / answerable if answerable else 0.0,
        hits=hits,
        false_hits=wrong,
        unjudged_hits=hits - correct - wrong,
        precision_all_hits=correct / hits if hits else 1.0,
    )


async def calibrate(
    cache: SemanticCache,
    pairs: Iterable[Pair],
    threshold: float | None = None,
    target_precision: float = 0.95,
    model: str = "calibration",
) -> CalibrationReport:
    pairs = list(pairs)
    tenant = f"calibrate-{uuid.uuid4().hex[:12]}"  # a fresh scope, flushed at the end
    if threshold is None:
        threshold = cache.thresholds.for_scope(tenant, model)
    threshold = validate_threshold(threshold)
    judgements = Judgements(pairs)
    queries = list(dict.fromkeys(p.query for p in pairs))
    cached = list(dict.fromkeys(p.cached for p in pairs))
    # A query is answerable if some seeded prompt answers it: a paraphrase, or the very
    # same text (a query that is also another pair's cached prompt hits the exact tier).
    answerable = sum(any(judgements.judge(c, q) for c in cached) for q in queries)
    try:
        for prompt in cached:
            await cache.seed(prompt, f"(answer to: {prompt})", model=model, tenant=tenant)
        results: dict[str, list[CheckedCandidate]] = {}
        for query in queries:
            request = CacheRequest(
                model=model,
                tenant=tenant,
                temperature=0.0,
                messages=[{"role": "user", "content": query}],
            )
            # Candidates well below any threshold on the curve, to rank them.
            lookup = await cache.lookup(request, dry_run=True, threshold=0.0, candidates=5)
            if lookup.status == "error":
                raise RuntimeError(f"lookup failed during calibration: {lookup.reason}")
            results[query] = lookup.candidates
    finally:
        await cache.store.flush(tenant=tenant)

    def curve(guard: bool) -> list[Score]:
        return [score(results, judgements, answerable, t, guard) for t in CURVE]

    with_guard = curve(True)
    recommended = next(
        (s.threshold for s in with_guard if s.precision >= target_precision and s.hits), None
    )
    return CalibrationReport(
        pairs=len(pairs),
        queries=len(queries),
        answerable=answerable,
        threshold=threshold,
        with_guard=score(results, judgements, answerable, threshold, True),
        without_guard=score(results, judgements, answerable, threshold, False),
        curve_with_guard=with_guard,
        curve_without_guard=curve(False),
        target_precision=target_precision,
        recommended_threshold=recommended,
    )

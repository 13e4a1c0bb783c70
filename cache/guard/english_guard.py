"""The English tier's guard: after a vector match, reject a candidate whose answer would
differ. The certain rules (`rules.py`) reject on their own; with the embeddings'
similarity, the verifier (`verifier.py`, fitted on the labelled pairs) decides what they
pass, weighing what the grey-zone rules found together with the similarity, the words
the two questions share and the cross-encoder's reading of the two side by side
(`cross_encoder.py`, through `pair_features.py`); without one, a grey rule rejects on
its own too.
"""

from __future__ import annotations

from dataclasses import dataclass

from cache.guard import cross_encoder
from cache.guard.features import Features, features
from cache.guard.pair_features import CROSS, clipped, pair_features
from cache.guard.rules import REGISTRY
from cache.guard.verdict import PASS, VERIFIER, Verdict
from cache.guard.verifier import VERIFIERS, Verifier


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
    A check the verifier decides may run the cross-encoder (~4.5 ms in int8 on one thread,
    on its worker): call it off the event loop. Without a `cross`, the shipped cross-encoder is
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
                values[CROSS] = clipped(self.cross.score(cached, query))
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

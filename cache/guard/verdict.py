"""What a guard answers about serving a cached answer to a new question: a `Verdict`,
which names the rule that rejected the candidate and what that rule found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    ok: bool
    rule: str | None = None
    detail: str = ""


PASS = Verdict(True)
VERIFIER = "verifier"  # the rule a verdict of a fitted verifier names


def fmt(values: object) -> str:
    """Values as a verdict's detail shows them: a collection in braces (a set sorted),
    numbers in their shortest form ("{17, 23.5}")."""
    if isinstance(values, tuple | list | set | frozenset):
        items = sorted(values) if isinstance(values, set | frozenset) else list(values)
        return "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in items) + "}"
    return str(values)

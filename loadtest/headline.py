"""A scenario's headline: one metric on both sides, their ratio and whether the goal is met."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Headline:
    metric: str
    path: tuple[str, ...]  # into a run's summary, e.g. ("itl", "p99_ms")
    values_ms: dict[str, float | None]  # side label -> value; the feature's side first
    goal: float | None  # least ratio baseline / feature, if the scenario has one

    @classmethod
    def of(
        cls, metric: str, path: tuple[str, ...], summaries: dict[str, Any], goal: float | None
    ) -> Headline:
        values = {}
        for label, summary in summaries.items():
            value: Any = summary
            for key in path:
                value = value[key]
            values[label] = value
        return cls(metric, path, values, goal)

    @property
    def ratio(self) -> float | None:
        """How many times lower the feature's side is than the baseline's."""
        feature, baseline = self.values_ms.values()
        return baseline / feature if feature and baseline is not None else None

    @property
    def met(self) -> bool | None:
        ratio = self.ratio
        return None if self.goal is None or ratio is None else ratio >= self.goal

    def text(self) -> str:
        """One Markdown sentence."""
        (a, va), (b, vb) = (
            (k, "-" if v is None else f"{v:,.1f} ms") for k, v in self.values_ms.items()
        )
        text = f"**{self.metric}**: {a} {va}, {b} {vb}"
        if self.ratio is not None:
            text += f": {self.ratio:.2f}x lower with {a}"
        if self.goal is not None:
            verdict = {True: "met", False: "not met", None: "not measured"}[self.met]
            text += f" (goal: at least {self.goal:g}x; {verdict})"
        return text + "."

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "path": list(self.path),
            "values_ms": self.values_ms,
            "ratio": self.ratio,
            "goal": self.goal,
            "met": self.met,
        }

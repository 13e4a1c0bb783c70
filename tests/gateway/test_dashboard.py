"""The Grafana dashboard in grafana/ asks only for metrics the gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai

from tests.gateway.conftest import messages
from tests.gateway.servers import MODEL, Server

DASHBOARD = Path(__file__).parents[2] / "grafana" / "semgate.json"


def _exported(text: str) -> set[str]:
    """Every series name /metrics can carry, from its TYPE lines (a histogram's too)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_every_dashboard_expression_names_exported_metrics(gateway: Server, alice: openai.OpenAI):
    # One answered request, so the labelled latency histograms have their series.
    alice.chat.completions.create(model=MODEL, messages=messages("Name a colour."), max_tokens=8)
    exported = _exported(httpx.get(gateway.url + "/metrics").text)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    expressions = [t["expr"] for p in panels for t in p["targets"]]
    assert len(expressions) >= 15
    for expr in expressions:
        for name in re.findall(r"\bsemgate_[a-z0-9_]+", expr):
            assert name in exported, f"{name} (in {expr})"

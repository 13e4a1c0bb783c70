"""The pieces of the routing scenarios that need no servers: how their sides' gateways
and engine servers are started, how the rag questions draw their contexts, and the
engine servers' table from two scrapes (tests/gateway/test_balancer_engines.py routes
over real servers)."""

from __future__ import annotations

from collections import Counter

import pytest

from loadtest.compare import ScenarioRun
from loadtest.rag import _context_order
from loadtest.scenarios import SCENARIOS
from loadtest.server_stats import Snapshot, between, table

MODEL = "smollm2-135m-instruct"


def test_a_forwarding_side_is_a_gateway_in_front_of_its_engine_servers() -> None:
    scenario = SCENARIOS["routing"]
    run = ScenarioRun(scenario)
    prefix, round_robin = scenario.sides
    args = run.serve_args(prefix, None, ["http://e1", "http://e2"])
    assert args[-2:] == ["--upstream", f"{MODEL}=http://e1,http://e2"]
    assert "--no-cache" in args and "--num-threads" not in args  # no engine of its own
    assert args[args.index("--upstream-policy") + 1] == "prefix"
    engine = run.engine_args()
    assert engine[:3] == ["--no-cache", "--num-threads", "1"]
    assert "--kv-cache-memory" in engine
    command = run.command(round_robin)
    assert "--upstream-policy round_robin" in command and "ENGINE1,ENGINE2" in command
    assert SCENARIOS[scenario.then or ""].max_server_share == 0.6


def test_a_side_without_engines_runs_its_own() -> None:
    run = ScenarioRun(SCENARIOS["prefix-cache"], num_threads=2)
    side = run.scenario.sides[1]
    assert run.serve_args(side, None, []) == [
        "--num-threads", "2", "--no-prefix-caching", "--no-cache"
    ]  # fmt: skip
    assert "ENGINE" not in run.command(side)


def test_contexts_in_turn_or_drawn_with_a_hot_one() -> None:
    assert _context_order(7, 3, None, 0) == [0, 1, 2, 0, 1, 2, 0]
    drawn = Counter(_context_order(4000, 5, 0.8, 0))
    assert 0.77 < drawn[0] / 4000 < 0.83
    assert all(0.03 < drawn[c] / 4000 < 0.07 for c in range(1, 5))
    assert _context_order(50, 5, 0.8, 0) == _context_order(50, 5, 0.8, 0)  # seeded
    even = Counter(_context_order(6000, 6, 1 / 6, 0))
    assert all(0.15 < n / 6000 < 0.19 for n in even.values())
    with pytest.raises(ValueError, match="rag_hot_fraction must be in"):
        _context_order(5, 3, 1.5, 0)


def test_the_engine_servers_table_counts_the_measured_rounds_only() -> None:
    before = Snapshot(
        {"a": Counter(fallback=1), "b": Counter()}, {"a": (0.0, 100.0), "b": (0.0, 0.0)}
    )
    after = Snapshot(
        {"a": Counter(fallback=1, prefix=6), "b": Counter(fallback=1, load=1)},
        {"a": (540.0, 700.0), "b": (10.0, 200.0)},
    )
    servers = between(before, after)
    assert servers["a"] == {
        "requests": 6,
        "share": 0.75,
        "by_reason": {"prefix": 6},
        "prefix_cache_hit_rate": 0.9,
    }
    assert servers["b"]["requests"] == 2 and servers["b"]["prefix_cache_hit_rate"] == 0.05
    text = table({"prefix": servers})
    assert "| prefix | a | 6 | 75% | prefix 6 | 90% |" in text
    assert "| prefix | b | 2 | 25% | fallback 1, load 1 | 5% |" in text

"""The load tests' workloads, built once. They run against the session's gateway
(tests/gateway/fixtures.py) as the `loadtest` tenant, a cache partition of their own."""

from __future__ import annotations

import pytest

from loadtest.meta import RunInfo
from loadtest.runner import LoadShape
from loadtest.work_item import WorkItem, WorkloadOptions
from loadtest.workload import build_workload


@pytest.fixture
def run_info() -> RunInfo:
    """Settings for reports written from hand-built records, stamped by hand."""
    return RunInfo(
        "sharegpt", WorkloadOptions(20), LoadShape(rate=2.0), {"server": "semgate serve"},
        date="2026-11-26T05:00:00Z", commit="abc1234",
    )  # fmt: skip


@pytest.fixture(scope="session")
def sharegpt() -> list[WorkItem]:
    return build_workload(
        "sharegpt", WorkloadOptions(40, max_prompt_tokens=256, max_output_tokens=12)
    )


@pytest.fixture(scope="session")
def rag() -> list[WorkItem]:
    return build_workload("rag", WorkloadOptions(2, rag_tokens=(1024, 1200), max_output_tokens=6))


@pytest.fixture(scope="session")
def mixed() -> list[WorkItem]:
    options = WorkloadOptions(
        4, long_fraction=0.5, rag_tokens=(1024, 1100), max_prompt_tokens=256,
        max_output_tokens=8, seed=3,
    )  # fmt: skip
    return build_workload("mixed", options)


@pytest.fixture(scope="session")
def repeat() -> list[WorkItem]:
    # Room for the bundled model's answers to end (only those are stored): at 64
    # tokens two of the eight int4 answers (66, 81 tokens) were cut short.
    return build_workload("repeat", WorkloadOptions(16, max_output_tokens=128))

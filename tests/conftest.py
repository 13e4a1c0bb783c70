"""Shared fixtures: the real bundled model, loaded once per test session."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engine import LLM, EngineConfig

# Redis, the embedder and the cache's event loop, shared by tests/cache and tests/bench.
pytest_plugins = ["tests.cache.fixtures"]


@pytest.fixture(scope="session")
def make_llm() -> Callable[..., LLM]:
    """Builds (once per distinct config) an engine with config overrides."""
    built: dict[tuple, LLM] = {}

    def make(**overrides: object) -> LLM:
        key = tuple(sorted(overrides.items()))
        if key not in built:
            built[key] = LLM(EngineConfig(**overrides))
        return built[key]

    return make


@pytest.fixture(scope="session")
def llm(make_llm: Callable[..., LLM]) -> LLM:
    return make_llm()

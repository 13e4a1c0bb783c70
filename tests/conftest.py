"""Shared fixtures: the real bundled model, loaded once per test session."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engine import LLM, EngineConfig
from engine.loaded_model import LoadedModel, ModelKey, load_model, model_key

# Session resources more than one test directory uses: Redis, the embedder and the
# cache's event loop (tests/cache, tests/bench); the gateway server (tests/gateway,
# tests/loadtest).
pytest_plugins = ["tests.cache.fixtures", "tests.gateway.fixtures"]

# The KV cache of each engine make_llm builds (unless a test sizes its own): ~700 blocks,
# 11k tokens, more than any test's batch. The default (10% of available RAM, ~1.9 GiB
# here) times the ~25 engines a session keeps reserved ~47 GiB of address space, and one
# merged mapping over the machine's RAM made fork() fail with ENOMEM.
TEST_KV_CACHE_BYTES = 512 << 20


@pytest.fixture(scope="session")
def make_llm() -> Callable[..., LLM]:
    """Builds (once per distinct config) an engine with config overrides. Engines whose
    configs build the same weights share them (engine/loaded_model.py): most variants
    differ only in scheduling, and loading is most of an engine's start-up."""
    built: dict[tuple, LLM] = {}
    models: dict[ModelKey, LoadedModel] = {}

    def make(**overrides: object) -> LLM:
        key = tuple(sorted(overrides.items()))
        if key not in built:
            config = EngineConfig(**{"kv_cache_memory": TEST_KV_CACHE_BYTES, **overrides})
            weights = model_key(config)
            if weights not in models:
                models[weights] = load_model(config)
            built[key] = LLM(config, models[weights])
        return built[key]

    return make


@pytest.fixture(scope="session")
def llm(make_llm: Callable[..., LLM]) -> LLM:
    return make_llm()


@pytest.fixture
def unwritable_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SEMGATE_CACHE_DIR pointed at a file, so no disk cache can be written under it."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(blocked))
    return blocked

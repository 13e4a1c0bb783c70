"""CacheRuntime's start: Redis (its own embedded one here), then the embedders and the
cross-encoder side by side, each piece's time kept; a model that fails to load is named
(no retry mends it), and what started is stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache import Embedder, MultilingualEmbedder
from cache.runtime import CacheRuntime, ModelNotLoaded
from tests.cache.fixtures import Run


def test_each_piece_says_how_long_it_took(
    tmp_path: Path, embedder: Embedder, multilingual: MultilingualEmbedder, run: Run
):
    async def lent() -> Embedder:
        return embedder

    runtime = CacheRuntime(data_dir=tmp_path, embedder=lent, multilingual=multilingual)

    async def start_and_stop() -> None:
        async with runtime as cache:
            assert cache.embedder is embedder

    run(start_and_stop())
    names = ["Redis", "embedder", "multilingual embedder", "cross-encoder"]
    assert list(runtime.load_times) == names
    assert all(t >= 0 for t in runtime.load_times.values())


def test_a_model_that_fails_to_load_is_named(
    tmp_path: Path, multilingual: MultilingualEmbedder, run: Run
):
    async def broken() -> Embedder:
        raise OSError("model.safetensors is missing")

    runtime = CacheRuntime(data_dir=tmp_path, embedder=broken, multilingual=multilingual)
    with pytest.raises(ModelNotLoaded, match=r"the embedder did not load: model\.safetensors is"):
        run(runtime.__aenter__())
    assert runtime.store is None  # nothing opened past the models
    assert runtime.server is not None and not runtime.server.running

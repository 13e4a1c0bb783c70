"""Labelled sets' embeddings are kept on disk per embedder and content."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.embedding_cache import embed_cached
from cache import Embedder
from cache.encoder_store import FORMAT

TEXTS = ["How do I reset my password?", "how can I change my password"]


def test_a_set_is_embedded_once_then_read_back(
    embedder: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(tmp_path))
    first = embed_cached(embedder, TEXTS)
    assert np.allclose(first, embedder.embed_many(TEXTS))
    [saved] = (tmp_path / "embeddings" / f"{embedder.model_id}-{FORMAT}").glob("*.npy")
    np.save(saved, np.zeros_like(first))  # what is on disk is what comes back
    assert not embed_cached(embedder, TEXTS).any()
    # Other texts (an edited file) miss and are embedded.
    assert np.allclose(embed_cached(embedder, TEXTS[::-1]), first[::-1])


def test_an_unwritable_cache_only_costs_the_reuse(
    embedder: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(blocked))
    assert np.allclose(embed_cached(embedder, TEXTS), embedder.embed_many(TEXTS))

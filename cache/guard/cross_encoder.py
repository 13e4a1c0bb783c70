"""The cross-encoder: all-MiniLM-L6-v2 reading a cached question and a new one together,
so each word of one attends to the other's, with a fitted head saying whether they ask
the same thing. Its logit is one of the English verifier's features (`cross`).

The embedder compares two pooled vectors, where a synonym swapped ("fall" / "collapse")
and another thing named ("fall" / "rise") move the similarity alike; read side by side,
the words tell them apart. The fit (`semgate cache train-cross-encoder`) keeps the
bundled model's weights and learns a low-rank change to each of its linear layers (LoRA,
rank `RANK`) and the head, on the English fit sets: the shipped file
(`cross_encoder.safetensors`) holds only those, 2.7 MB. Loading adds each
change to its layer once, so a pair costs one forward of the plain model.

Serving (`CrossEncoder`) loads a prepared form: the folded model, its pooling and its
head traced and frozen as one TorchScript module. Its linear layers are int8 where the CPU
multiplies int8 (`serving_dtype`; cache/int8_linear.py, as the embedder's: weights per
output channel, activations per token), float32 elsewhere: a pair's forward takes ~4.5 ms
instead of ~10 ms on one thread of this CPU, its logits within ~0.04 of float32's (median
on the held-out pairs; 0.3 at most). It is built at the first load (~3.4 s, through
transformers) and kept on disk by cache/encoder_store.py, keyed by the adapter file, the
base model's files, torch's version, the dtype and `FORMAT`; a later load takes ~0.2 s and
imports no transformers. The fit (bench/cross_encoder_fit.py) trains the eager model and
scores the held-out files the verifier is fitted on through this same prepared form.

Scoring runs on one worker thread with one torch thread (as the embedder's workers do:
two teams on two cores wait on each other), off the event loop.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, cast

import tokenizers
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from cache import encoder_store
from cache.embedder import resolve_embedder_path
from cache.int8_linear import int8_kernels, quantize_linears

if TYPE_CHECKING:
    from transformers import BertModel

log = logging.getLogger(__name__)

BASE = "all-minilm-l6-v2"
WEIGHTS = Path(str(files("cache.guard").joinpath("cross_encoder.safetensors")))
# The linear layers of each BERT layer that get a low-rank change.
ADAPTED = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
MAX_TOKENS = 128  # both questions together; a longer pair is cut from the end
# The verifier's `cross` feature is the logit clipped to +-BOUND (the fit sets' held-out
# logits reach +-6.7), so the guard can tell when no logit could change its answer.
BOUND = 8.0
BATCH = 32
# Served pairs are scored one at a time, as the guard asks for them: in a padded batch a
# pair's int8 logit moves by up to ~0.015.
ALONE = 1
# What a prepared form was built by: bump it when the build changes (`PairScorer`, the
# folding, the quantisation, the tracing), or old prepared forms keep serving it.
FORMAT = 2  # 2: int8 linear layers where the CPU has int8 kernels
DTYPES = ("int8", "float32")


def load_base() -> tuple[BertModel, tokenizers.Tokenizer]:
    """The bundled MiniLM (its transformer, without pooling) and its tokenizer, set to
    encode pairs: [CLS] cached [SEP] query [SEP], with segment ids."""
    from transformers import BertConfig, BertModel

    _, path = resolve_embedder_path(BASE)
    model = BertModel(BertConfig.from_pretrained(path), add_pooling_layer=False)
    # The file also has the pooler (unused here) and old checkpoints' position ids.
    wanted = model.state_dict().keys()
    weights = load_file(str(path / "model.safetensors"))
    model.load_state_dict({k: v for k, v in weights.items() if k in wanted})
    tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_TOKENS)
    pad = tokenizer.token_to_id("[PAD]")
    tokenizer.enable_padding(pad_id=pad, pad_token="[PAD]")
    return model, tokenizer


def adapted_linears(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The linear layers LoRA changes, by their names in the adapter file (their paths
    under `model.encoder`)."""
    layers = model.get_submodule("encoder.layer").children()
    return {
        f"layer.{i}.{name}": cast(torch.nn.Linear, layer.get_submodule(name))
        for i, layer in enumerate(layers)
        for name in ADAPTED
    }


def encode_pairs(
    tokenizer: tokenizers.Tokenizer, pairs: Sequence[tuple[str, str]]
) -> dict[str, torch.Tensor]:
    encoded = tokenizer.encode_batch(list(pairs))
    return {
        "input_ids": torch.tensor([e.ids for e in encoded]),
        "token_type_ids": torch.tensor([e.type_ids for e in encoded]),
        "attention_mask": torch.tensor([e.attention_mask for e in encoded]),
    }


def pooled_logit(
    model: torch.nn.Module, head: torch.nn.Linear, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The head over the mean of the pair's token states (the embedder's pooling)."""
    states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
    pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
    return head(pooled).squeeze(-1)


class PairScorer(torch.nn.Module):
    """A pair batch's tensors (`encode_pairs`) -> logits: the model and the head as one
    module, the piece that gets traced (and kept on disk: a change here bumps FORMAT)."""

    def __init__(self, model: torch.nn.Module, head: torch.nn.Linear) -> None:
        super().__init__()
        self.model = model
        self.head = head

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        batch = {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": attention_mask,
        }
        return pooled_logit(self.model, self.head, batch)


@torch.inference_mode()
def logits(
    scorer: Callable[..., torch.Tensor],
    tokenizer: tokenizers.Tokenizer,
    pairs: Sequence[tuple[str, str]],
    batch: int = BATCH,
) -> list[float]:
    """The logits of (cached, query) pairs by a `PairScorer` (eager or traced), `batch`
    at a time."""
    out: list[float] = []
    for i in range(0, len(pairs), batch):
        out += scorer(**encode_pairs(tokenizer, pairs[i : i + batch])).tolist()
    return out


@dataclass(frozen=True)
class Folded:
    """The eager cross-encoder: the bundled model with an adapter folded in, and what it
    was fitted on."""

    scorer: PairScorer
    tokenizer: tokenizers.Tokenizer
    fitted_on: list[str]


def fold(weights: Path) -> Folded:
    """The bundled model with the adapter file's changes folded into its layers (LoRA's
    W + scale * B A, once) and its head."""
    model, tokenizer = load_base()
    model.eval()
    # One read of the file: its metadata, and only the tensors serving needs (not the fit
    # files' held-out logits).
    with safe_open(str(weights), framework="pt") as f, torch.no_grad():
        meta = f.metadata() or {}
        if meta.get("base") != BASE:
            raise ValueError(f"{weights} is not a cross-encoder adapter of {BASE}")
        scale = float(meta["scale"])
        for name, linear in adapted_linears(model).items():
            linear.weight += scale * f.get_tensor(f"{name}.b") @ f.get_tensor(f"{name}.a")
        weight, bias = f.get_tensor("head.weight"), f.get_tensor("head.bias")
        head = torch.nn.Linear(weight.shape[1], 1)  # one logit from a pooled state
        head.load_state_dict({"weight": weight, "bias": bias})
    fitted_on = [name for name, _, _ in json.loads(meta.get("files", "[]"))]
    return Folded(PairScorer(model, head).eval(), tokenizer, fitted_on)


def serving_dtype() -> str:
    """What `CrossEncoder` serves in here: int8 where the CPU multiplies int8 matrices."""
    return "int8" if int8_kernels() else "float32"


def build(weights: Path, dtype: str) -> encoder_store.Stored:
    """The prepared form: the folded model, its linear layers in int8 for "int8" (the head,
    one output, stays float), traced and frozen. The traced graph keeps its shapes dynamic
    once it sees a padded batch (transformers takes no shape-dependent branch then), so two
    pairs of different lengths are its sample."""
    if dtype not in DTYPES:
        raise ValueError(f"the cross-encoder serves in {' or '.join(DTYPES)}, not {dtype!r}")
    folded = fold(weights)
    if dtype == "int8":
        quantize_linears(folded.scorer.model)
    sample = encode_pairs(folded.tokenizer, [("a pair", "to trace"), ("a longer one", "to pad")])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's and transformers' tracer warnings
        traced = torch.jit.trace(folded.scorer, example_kwarg_inputs=sample, check_trace=False)
        frozen = torch.jit.freeze(traced)
    return encoder_store.Stored(frozen, folded.tokenizer, {"fitted_on": folded.fitted_on})


def prepared(weights: Path, dtype: str) -> encoder_store.Stored:
    """The prepared form of the adapter file `weights` in `dtype`: from disk, else built and
    kept."""
    _, base = resolve_embedder_path(BASE)
    name = [str(weights.resolve()), str(base.resolve()), dtype]
    where = encoder_store.entry_file("cross-encoders", name)
    key = {
        "format": FORMAT,
        "adapter": encoder_store.files_key(weights),
        "base": encoder_store.files_key(base),
        "dtype": dtype,
        "torch": torch.__version__,
    }

    def built() -> encoder_store.Stored:
        log.info("building the cross-encoder's prepared form of %s (kept in %s)", weights, where)
        return build(weights, dtype)

    return encoder_store.kept(where, key, built)


class CrossEncoder:
    """`score(cached, query)` -> the logit that the two ask the same thing."""

    def __init__(self, weights: Path = WEIGHTS, dtype: str | None = None) -> None:
        self.dtype = serving_dtype() if dtype is None else dtype
        stored = prepared(weights, self.dtype)
        self._scorer = stored.module
        self._tokenizer = stored.tokenizer
        self.fitted_on: list[str] = list(stored.numbers["fitted_on"])
        self._worker = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="cross-encoder", initializer=_one_thread
        )
        # TorchScript optimises the graph over its first two calls (tens of ms for a pair,
        # ~4.5 ms after in int8, whatever the shape): made here, not by the first lookups.
        for _ in range(2):
            self._worker.submit(logits, self._scorer, self._tokenizer, [("warm", "up")], ALONE)

    def score(self, cached: str, query: str) -> float:
        return self.score_many([(cached, query)])[0]

    def score_many(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Logits of (cached, query) pairs, each scored alone, on the worker (blocking the
        caller)."""
        job = self._worker.submit(logits, self._scorer, self._tokenizer, list(pairs), ALONE)
        return job.result()

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def _one_thread() -> None:
    # Torch keeps the count per thread, but a thread's first parallel op re-applies the
    # count last set anywhere unless the thread asked first: get, then set.
    torch.get_num_threads()
    torch.set_num_threads(1)


@functools.cache
def shared() -> CrossEncoder:
    """The shipped cross-encoder, loaded once per process on first use."""
    return CrossEncoder()

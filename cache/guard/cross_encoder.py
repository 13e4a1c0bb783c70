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

Scoring runs on one worker thread with one torch thread (as the embedder's workers do:
two teams on two cores wait on each other), off the event loop.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, cast

import tokenizers
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from cache.embedder import resolve_embedder_path

if TYPE_CHECKING:
    from transformers import BertModel

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


@torch.inference_mode()
def logits(
    model: torch.nn.Module,
    head: torch.nn.Linear,
    tokenizer: tokenizers.Tokenizer,
    pairs: Sequence[tuple[str, str]],
) -> list[float]:
    """The logits of (cached, query) pairs, `BATCH` at a time."""
    out: list[float] = []
    for i in range(0, len(pairs), BATCH):
        out += pooled_logit(model, head, encode_pairs(tokenizer, pairs[i : i + BATCH])).tolist()
    return out


class CrossEncoder:
    """`score(cached, query)` -> the logit that the two ask the same thing."""

    def __init__(self, weights: Path = WEIGHTS) -> None:
        self.model, self._tokenizer = load_base()
        self.model.eval()
        # One read of the file: its metadata, and only the tensors serving needs (not the
        # fit files' held-out logits).
        with safe_open(str(weights), framework="pt") as f, torch.no_grad():
            meta = f.metadata() or {}
            if meta.get("base") != BASE:
                raise ValueError(f"{weights} is not a cross-encoder adapter of {BASE}")
            scale = float(meta["scale"])
            for name, linear in adapted_linears(self.model).items():
                # LoRA's change, W + scale * B A, folded into the layer once.
                linear.weight += scale * f.get_tensor(f"{name}.b") @ f.get_tensor(f"{name}.a")
            weight, bias = f.get_tensor("head.weight"), f.get_tensor("head.bias")
            self.head = torch.nn.Linear(weight.shape[1], 1)  # one logit from a pooled state
            self.head.load_state_dict({"weight": weight, "bias": bias})
        self.fitted_on: list[str] = [name for name, _, _ in json.loads(meta.get("files", "[]"))]
        self._worker = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="cross-encoder", initializer=_one_thread
        )

    def score(self, cached: str, query: str) -> float:
        return self.score_many([(cached, query)])[0]

    def score_many(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Logits of (cached, query) pairs, on the worker (blocking the caller)."""
        job = self._worker.submit(logits, self.model, self.head, self._tokenizer, list(pairs))
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

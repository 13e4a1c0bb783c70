"""Fits the cross-encoder (`cache/guard/cross_encoder.py`) to labelled English pairs with LoRA:
the bundled MiniLM's weights stay as they are; each adapted linear layer learns a change
B A of rank `RANK` (B starts at zero, so training starts from the plain model), and a
head over the pooled token states learns the label.

Each pair is shown in both orders (a cached question and a new one are the same question
either way round). Binary cross-entropy, AdamW, a linear warm-up over the first tenth of
the steps and a linear decay to zero; `EPOCHS` passes. On two CPU cores a fit of the 27
English fit sets (~5,500 pairs, ~700 steps) takes about 8 minutes, and the held-out
scores the verifier is fitted on (`held_out_logits`: `FOLDS` more fits) about 15 more.
Those are scored as the guard will score: each fold's adapter built into the prepared form
`CrossEncoder` serves (int8 where the CPU has int8 kernels), a pair at a time.
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bench.calibrate import Pair
from cache import encoder_store
from cache.guard.cross_encoder import (
    ALONE,
    BASE,
    adapted_linears,
    build,
    encode_pairs,
    load_base,
    logits,
    pooled_logit,
    serving_dtype,
)

RANK = 16
SCALE = 2.0  # LoRA's alpha / rank
EPOCHS = 2.0
LEARNING_RATE = 1e-3
BATCH = 32
SEED = 0
FOLDS = 3
HELD_OUT = "held_out.logits"
# Adapter files written before the held-out logits were scored through the prepared form
# have no `held_out_dtype`: theirs came from the eager float32 model.
LEGACY_DTYPE = "float32"


class LowRankChange(torch.nn.Module):
    """A frozen linear layer plus a trained change of low rank: W x + scale * B A x."""

    def __init__(self, base: torch.nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        # A small and random, B zero: the sum starts as the base layer.
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / base.in_features**0.5)
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + SCALE * (x @ self.a.t() @ self.b.t())


@dataclass
class AdaptedModel:
    """The bundled MiniLM with a `LowRankChange` in place of each adapted layer, and a head."""

    model: torch.nn.Module
    tokenizer: tokenizers.Tokenizer
    changes: dict[str, LowRankChange]  # by their names in the adapter file
    head: torch.nn.Linear

    def logits(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        return pooled_logit(self.model, self.head, encode_pairs(self.tokenizer, pairs))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors: each change's `a` and `b`, and the head."""
        out = {f"{name}.{part}": getattr(c, part).detach().clone()
               for name, c in self.changes.items() for part in ("a", "b")}  # fmt: skip
        out["head.weight"] = self.head.weight.detach().clone()
        out["head.bias"] = self.head.bias.detach().clone()
        return out


def adapted_model() -> AdaptedModel:
    """The model to train: the base frozen, the changes and the head trainable."""
    model, tokenizer = load_base()
    for p in model.parameters():
        p.requires_grad = False
    changes = {}
    for name, linear in adapted_linears(model).items():
        parent, _, attr = name.rpartition(".")
        changes[name] = LowRankChange(linear, RANK)
        setattr(model.encoder.get_submodule(parent), attr, changes[name])
    return AdaptedModel(model, tokenizer, changes, torch.nn.Linear(model.config.hidden_size, 1))


def train(
    pairs: Sequence[Pair],
    epochs: float = EPOCHS,
    seed: int = SEED,
    progress: Callable[[int, int, float], None] | None = None,
) -> AdaptedModel:
    """The model fitted on `pairs` (in eval mode)."""
    torch.manual_seed(seed)
    shuffle = random.Random(seed)
    adapted = adapted_model()
    changes, head = adapted.changes, adapted.head
    trained = [p for c in changes.values() for p in (c.a, c.b)] + list(head.parameters())
    examples = [(p.cached, p.query, p.label) for p in pairs]
    examples += [(p.query, p.cached, p.label) for p in pairs]
    steps = max(1, int(len(examples) * epochs / BATCH))
    optimizer = torch.optim.AdamW(trained, lr=LEARNING_RATE, weight_decay=0.01)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / steps)
    )
    adapted.model.train()
    step = 0
    while step < steps:
        shuffle.shuffle(examples)
        for i in range(0, len(examples), BATCH):
            if step >= steps:
                break
            batch = examples[i : i + BATCH]
            logits = adapted.logits([b[:2] for b in batch])
            labels = torch.tensor([float(b[2]) for b in batch])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            if progress is not None:
                progress(step, steps, loss.item())
    adapted.model.eval()
    return adapted


@dataclass(frozen=True)
class HeldOut:
    """The fit files' held-out logits, in the files' order, and the dtype of the prepared
    form that scored them."""

    logits: torch.Tensor
    dtype: str


def served_form(adapted: AdaptedModel, dtype: str) -> encoder_store.Stored:
    """The prepared form `CrossEncoder` would serve of a trained model: its adapter written
    out and built as the shipped one is (folded, quantised for int8, traced)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adapter.safetensors"
        save(adapted.tensors(), path, {})
        return build(path, dtype)


def held_out_logits(
    files: dict[str, list[Pair]],
    folds: int = FOLDS,
    progress: Callable[[int, int, float], None] | None = None,
    dtype: str | None = None,
) -> HeldOut:
    """Each file's pairs scored by a model fitted on the other folds (files dealt out in
    turn), in the files' order: the verifier is fitted on these, as the shipped model
    will read questions it was not fitted on. Fitted on its own training pairs, the
    verifier would trust the cross-encoder far more than it earns. Each fold is scored
    through its prepared form in `dtype` (the one served here unless given), a pair at a
    time, as the guard scores."""
    dtype = serving_dtype() if dtype is None else dtype
    names = list(files)
    scored: dict[str, torch.Tensor] = {}
    for k in range(folds):
        held = names[k::folds]
        rest = [p for name in names if name not in held for p in files[name]]
        served = served_form(train(rest, progress=progress), dtype)
        for name in held:
            rows = [(p.cached, p.query) for p in files[name]]
            scored[name] = torch.tensor(logits(served.module, served.tokenizer, rows, ALONE))
    return HeldOut(torch.cat([scored[name] for name in names]), dtype)


def pairs_digest(pairs: Sequence[Pair]) -> str:
    text = json.dumps([[p.cached, p.query, p.label] for p in pairs])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_held_out(
    path: Path, files: dict[str, list[Pair]], served: str
) -> dict[str, list[float] | None]:
    """The held-out logits an adapter file keeps, for each of `files` it was fitted on
    (None for a file it was not fitted on: the shipped model has not seen that one).
    A file it was fitted on must be as it was then, and the logits must have been scored
    through the prepared form served here (dtype `served`): the verifier's cut is fitted
    on them."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        fitted = json.loads(meta.get("files", "[]"))
        scores = f.get_tensor(HELD_OUT).tolist()
    scored_in = meta.get("held_out_dtype", LEGACY_DTYPE)
    if scored_in != served:
        raise ValueError(
            f"{path}'s held-out logits were scored in {scored_in}, but the cross-encoder serves "
            f"in {served} here: run semgate cache train-cross-encoder"
        )
    where, start = {}, 0
    for name, count, digest in fitted:
        where[name], start = (start, count, digest), start + count
    out: dict[str, list[float] | None] = {}
    for name, pairs in files.items():
        if name not in where:
            out[name] = None
            continue
        start, count, digest = where[name]
        if pairs_digest(pairs) != digest:
            raise ValueError(
                f"{name} changed since the cross-encoder was fitted on it: run semgate cache "
                "train-cross-encoder"
            )
        out[name] = scores[start : start + count]
    return out


def save(
    tensors: dict[str, torch.Tensor],
    path: Path,
    files: dict[str, list[Pair]],
    held_out: HeldOut | None = None,
) -> None:
    """The adapter file `CrossEncoder` reads: the tensors, the base model, LoRA's scale
    and the fit's inputs, and beside them the fit files' held-out logits and the dtype
    they were scored in (`read_held_out`)."""
    meta = {
        "base": BASE,
        "rank": str(RANK),
        "scale": str(SCALE),
        "epochs": str(EPOCHS),
        "seed": str(SEED),
        # Each fit file: its name, its number of pairs and their digest (`read_held_out`).
        "files": json.dumps([[name, len(ps), pairs_digest(ps)] for name, ps in files.items()]),
    }
    if held_out is not None:
        tensors = tensors | {HELD_OUT: held_out.logits}
        meta["held_out_dtype"] = held_out.dtype
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)

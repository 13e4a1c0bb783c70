"""A model built from its file for one device, dtype, weight mode and context length.
Engines that differ only in how they schedule (batch sizes, chunked prefill, prefix
caching, speculation) can share one: its forward pass keeps no state between calls
(each engine owns its KV cache), so a second engine needs no second load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from engine.config import EngineConfig
from engine.loader import load_model_files
from engine.model import CausalLM, ModelConfig
from engine.tokenizer import Tokenizer


class ModelKey(NamedTuple):
    """What the built weights depend on; everything else in EngineConfig is the engine's."""

    path: Path
    device: str
    dtype: str
    quantization: str | None
    max_model_len: int | None  # None: the model's own; sizes the rotary tables


def model_key(config: EngineConfig) -> ModelKey:
    return ModelKey(
        config.model_path, config.device, config.dtype, config.quantization, config.max_model_len
    )


@dataclass(frozen=True)
class LoadedModel:
    key: ModelKey
    config: ModelConfig
    model: CausalLM
    tokenizer: Tokenizer

    @property
    def max_model_len(self) -> int:
        return context_length(self.key, self.config)


def context_length(key: ModelKey, config: ModelConfig) -> int:
    """The configured context length, else the model's own."""
    return key.max_model_len or config.max_position_embeddings


def load_model(config: EngineConfig) -> LoadedModel:
    model_config, weights, tokenizer = load_model_files(config.model_path)
    key = model_key(config)
    model = CausalLM(
        model_config,
        weights,
        context_length(key, model_config),
        torch.device(config.device),
        config.torch_dtype,
        config.quantization,
    )
    return LoadedModel(key, model_config, model, tokenizer)

"""The model's tokenizer, for sizing workloads in tokens. Only the tokenizer is read (GGUF
metadata or tokenizer.json), never the weights: the load generator runs no model."""

from __future__ import annotations

from functools import cache

from engine import loader
from engine.config import resolve_model_path
from engine.tokenizer import Tokenizer


@cache
def load_tokenizer(model: str) -> Tokenizer:
    """`model`: a bundled model name, a .gguf file or a Hugging Face directory."""
    return loader.load_tokenizer(resolve_model_path(model))

"""The model's tokenizer, for sizing workloads in tokens. Only the tokenizer is read (GGUF
metadata or tokenizer.json), never the weights: the load generator runs no model."""

from __future__ import annotations

from functools import cache

from gguf import GGUFReader

from engine.config import resolve_model_path
from engine.tokenizer import Tokenizer


@cache
def load_tokenizer(model: str) -> Tokenizer:
    """`model`: a bundled model name, a .gguf file or a Hugging Face directory."""
    path = resolve_model_path(model)
    if path.suffix != ".gguf":
        return Tokenizer.from_hf_dir(path, [])
    reader = GGUFReader(path)
    meta = {name: f.contents() for name, f in reader.fields.items() if name.startswith("tok")}
    return Tokenizer.from_gguf_metadata(meta)

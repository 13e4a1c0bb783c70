"""The built embedder encoder, kept on disk.

Building the embedder's encoder (cache.embedder) imports sentence-transformers (~5 s:
it pulls transformers, sklearn and scipy), loads the model, quantises or casts it and
traces it, paid by every `semgate serve` start and every test server. What the build
gives (the frozen TorchScript module, the tokenizer and a few numbers) is kept as one
TorchScript file, the rest as its extra files, and a later start loads it without
importing sentence-transformers or transformers: an int8 Embedder in a fresh process
(imports included) took 6.5 s to build and 1.7 s to load, medians of 5 on two cores,
~1.4 s of the latter importing torch and cache.

An entry is named by the model directory's resolved path, the model id and the dtype,
and holds its key: that path with the size and mtime of each file under it, the model
id, the dtype, torch's version and FORMAT. An entry whose key differs, or that cannot be
read, is rebuilt and rewritten. Entries live in embedders/ under cache_dir()."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch

log = logging.getLogger(__name__)

# An entry's layout and what it was built by: bump it when the build changes (the
# _Encoder's pooling, the quantisation, the tracing), or old entries keep serving it.
FORMAT = 2  # 2: int8 through int8_linear.py, not torch.ao's quantized tensors
_META = "semgate_meta.json"
_TOKENIZER = "semgate_tokenizer.json"


@dataclass(frozen=True)
class BuiltEncoder:
    """What building an embedder gives: the frozen module (input ids + mask -> unit
    vectors), its tokenizer as loaded (no truncation or padding set up) and its numbers."""

    encoder: torch.jit.ScriptModule
    tokenizer: tokenizers.Tokenizer
    dims: int
    max_tokens: int
    pad_token: str
    pad_id: int
    model_id: str


def cache_dir() -> Path:
    """$SEMGATE_CACHE_DIR, else $XDG_CACHE_HOME/semgate, else ~/.cache/semgate (the rule
    of engine.disk_cache.cache_dir, which cache/ may not import)."""
    if explicit := os.environ.get("SEMGATE_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "semgate"


def entry_path(model_path: Path, model_id: str, dtype: str) -> Path:
    """Where the entry for this model directory, model id and dtype is kept."""
    name = json.dumps([str(model_path.resolve()), model_id, dtype])
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    return cache_dir() / "embedders" / f"{digest}.pt"


def entry_key(model_path: Path, model_id: str, dtype: str) -> dict[str, Any]:
    """What an entry must have been built from to be used."""
    root = model_path.resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {
        "format": FORMAT,
        "path": str(root),
        "files": [
            [str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files
        ],
        "model_id": model_id,
        "dtype": dtype,
        "torch": torch.__version__,
    }


def load(model_path: Path, model_id: str, dtype: str) -> BuiltEncoder | None:
    """The entry built from this model directory (unchanged since), model id and dtype,
    or None when there is none or it cannot be read."""
    where = entry_path(model_path, model_id, dtype)
    if not where.exists():
        return None
    extra: dict[str, Any] = {_META: "", _TOKENIZER: ""}
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript for torch.export; the project pins
            # torch < 2.14, where it works (the model is traced with it too).
            warnings.simplefilter("ignore", DeprecationWarning)
            encoder = torch.jit.load(str(where), map_location="cpu", _extra_files=extra)
        meta = json.loads(extra[_META])  # extra files come back as bytes
        if meta["key"] != entry_key(model_path, model_id, dtype):
            return None
        return BuiltEncoder(
            encoder=encoder,
            tokenizer=tokenizers.Tokenizer.from_str(bytes(extra[_TOKENIZER]).decode()),
            dims=int(meta["dims"]),
            max_tokens=int(meta["max_tokens"]),
            pad_token=str(meta["pad_token"]),
            pad_id=int(meta["pad_id"]),
            model_id=str(meta["model_id"]),
        )
    except Exception as exc:  # torch, json and tokenizers each raise their own
        log.warning("embedder entry %s cannot be read (%s): building the encoder", where, exc)
        return None


def save(model_path: Path, model_id: str, dtype: str, built: BuiltEncoder) -> None:
    """Written aside and renamed: a reader never sees half an entry. A cache that cannot
    be written (read-only home, a file in the way) only costs the reuse."""
    where = entry_path(model_path, model_id, dtype)
    meta = {
        "key": entry_key(model_path, model_id, dtype),
        "dims": built.dims,
        "max_tokens": built.max_tokens,
        "pad_token": built.pad_token,
        "pad_id": built.pad_id,
        "model_id": built.model_id,
    }
    extra = {_META: json.dumps(meta), _TOKENIZER: built.tokenizer.to_str()}
    temp = None
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=where.parent, suffix=".tmp")
        os.close(fd)
        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript for torch.export; the project pins
            # torch < 2.14, where it works (the model is traced with it too).
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(built.encoder, temp, _extra_files=extra)
        os.replace(temp, where)
    except (OSError, RuntimeError) as exc:
        log.warning("embedder entry %s not written (%s)", where, exc)
        if temp is not None:
            Path(temp).unlink(missing_ok=True)

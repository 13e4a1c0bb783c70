"""Built encoders, kept on disk: the embedder's (cache.embedder) and the cross-encoder's
(cache.guard.cross_encoder).

Building the embedder's encoder imports sentence-transformers (~5 s: it pulls
transformers, sklearn and scipy), loads the model, quantises or casts it and traces it;
building the cross-encoder imports transformers, loads the model, folds its adapter in
and traces it (~3.4 s). Every `semgate serve` start and every test server paid both.
What a build gives (the frozen TorchScript module, its tokenizer and a few numbers) is
kept as one TorchScript file, the tokenizer and the numbers as its extra files, and a
later start loads it without importing sentence-transformers or transformers: an int8
Embedder in a fresh process (imports included) took 6.5 s to build and 1.7 s to load,
medians of 5 on two cores, ~1.4 s of the latter importing torch and cache.

An entry is named by what it is built from and holds its key: the files it was built
from with the size and mtime of each, torch's version, the build's FORMAT and whatever
else the build depends on (the embedder's model id and dtype). An entry whose key
differs, or that cannot be read, is rebuilt and rewritten. Entries live in a folder per
kind under cache_dir(): embedders/ and cross-encoders/."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch

log = logging.getLogger(__name__)

# Builds take turns (`kept`): each imports transformers, whose lazy module raised "cannot
# import name 'BertConfig'" when the embedder and the cross-encoder were built on two
# threads at once (a cold start, where cache/runtime.py loads them side by side). Reading
# a kept entry imports neither and takes no turn.
_BUILD_LOCK = threading.Lock()

# What an embedder entry was built by: bump it when the build changes (the _Encoder's
# pooling, the quantisation, the tracing), or old entries keep serving it.
FORMAT = 2  # 2: int8 through int8_linear.py, not torch.ao's quantized tensors
_META = "semgate_meta.json"
_TOKENIZER = "semgate_tokenizer.json"


@dataclass(frozen=True)
class Stored:
    """An entry's contents: the frozen module, its tokenizer and the build's numbers."""

    module: torch.jit.ScriptModule
    tokenizer: tokenizers.Tokenizer
    numbers: dict[str, Any]


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


def entry_file(kind: str, name: Sequence[str]) -> Path:
    """Where the entry of this kind (its folder) built from `name`'s sources is kept."""
    digest = hashlib.sha256(json.dumps(list(name)).encode()).hexdigest()[:32]
    return cache_dir() / kind / f"{digest}.pt"


def files_key(path: Path) -> list[list[Any]]:
    """The file at `path`, or each file under it: its path relative to `path`, its size
    and its mtime."""
    root = path.resolve()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def read(where: Path, key: dict[str, Any]) -> Stored | None:
    """The entry at `where` if it was built from `key`; None when there is none, it was
    built from something else or it cannot be read."""
    if not where.exists():
        return None
    extra: dict[str, Any] = {_META: "", _TOKENIZER: ""}
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript for torch.export; the project pins
            # torch < 2.14, where it works (the models are traced with it too).
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(where), map_location="cpu", _extra_files=extra)
        meta = json.loads(extra[_META])  # extra files come back as bytes
        if meta["key"] != key:
            return None
        tokenizer = tokenizers.Tokenizer.from_str(bytes(extra[_TOKENIZER]).decode())
        return Stored(module, tokenizer, {k: v for k, v in meta.items() if k != "key"})
    except Exception as exc:  # torch, json and tokenizers each raise their own
        log.warning("built encoder %s cannot be read (%s): building it again", where, exc)
        return None


def write(where: Path, key: dict[str, Any], stored: Stored) -> None:
    """Written aside and renamed: a reader never sees half an entry. A cache that cannot
    be written (read-only home, a file in the way) only costs the reuse."""
    meta = {"key": key, **stored.numbers}
    extra = {_META: json.dumps(meta), _TOKENIZER: stored.tokenizer.to_str()}
    temp = None
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=where.parent, suffix=".tmp")
        os.close(fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # as in `read`
            torch.jit.save(stored.module, temp, _extra_files=extra)
        os.replace(temp, where)
    except (OSError, RuntimeError) as exc:
        log.warning("built encoder %s not written (%s)", where, exc)
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def kept(where: Path, key: dict[str, Any], build: Callable[[], Stored]) -> Stored:
    """The entry at `where` built from `key`: read, else built (one build at a time) and
    written."""
    stored = read(where, key)
    if stored is None:
        with _BUILD_LOCK:
            stored = build()
        write(where, key, stored)
    return stored


def entry_path(model_path: Path, model_id: str, dtype: str) -> Path:
    """Where the embedder entry for this model directory, model id and dtype is kept."""
    return entry_file("embedders", [str(model_path.resolve()), model_id, dtype])


def entry_key(model_path: Path, model_id: str, dtype: str) -> dict[str, Any]:
    """What an embedder entry must have been built from to be used."""
    return {
        "format": FORMAT,
        "path": str(model_path.resolve()),
        "files": files_key(model_path),
        "model_id": model_id,
        "dtype": dtype,
        "torch": torch.__version__,
    }


def load(model_path: Path, model_id: str, dtype: str) -> BuiltEncoder | None:
    """The embedder built from this model directory (unchanged since), model id and
    dtype, or None when there is none or it cannot be read."""
    stored = read(entry_path(model_path, model_id, dtype), entry_key(model_path, model_id, dtype))
    return None if stored is None else _built(stored)


def load_or_build(
    model_path: Path, model_id: str, dtype: str, build: Callable[[], BuiltEncoder]
) -> BuiltEncoder:
    """`load`'s embedder, else `build`'s, kept for the next load."""
    where, key = entry_path(model_path, model_id, dtype), entry_key(model_path, model_id, dtype)
    return _built(kept(where, key, lambda: _stored(build())))


def _built(stored: Stored) -> BuiltEncoder:
    numbers = stored.numbers  # written with the entry's key, so by this FORMAT's _stored
    return BuiltEncoder(
        encoder=stored.module,
        tokenizer=stored.tokenizer,
        dims=int(numbers["dims"]),
        max_tokens=int(numbers["max_tokens"]),
        pad_token=str(numbers["pad_token"]),
        pad_id=int(numbers["pad_id"]),
        model_id=str(numbers["model_id"]),
    )


def _stored(built: BuiltEncoder) -> Stored:
    numbers = {
        "dims": built.dims,
        "max_tokens": built.max_tokens,
        "pad_token": built.pad_token,
        "pad_id": built.pad_id,
        "model_id": built.model_id,
    }
    return Stored(built.encoder, built.tokenizer, numbers)

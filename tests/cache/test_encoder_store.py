"""The built embedder encoder kept on disk (cache/encoder_store.py), with the real model:
a warm start gives the cold build's vectors bit for bit and imports neither
sentence-transformers nor transformers; a corrupt or stale entry is rebuilt."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from cache import Embedder, encoder_store
from cache.embedder import resolve_embedder_path
from tests.cache.fresh_process import in_fresh_process

LONG = " ".join(f"word{i} of a long prompt" for i in range(200))  # ~1000 tokens
TEXTS = [
    "",
    "hi",
    "What is the capital of France?",
    "what is the capital of france",
    "Explain TCP slow start in two sentences.",
    "Résumé naïve café: déjà vu, über straße.",
    "日本の首都はどこですか",
    "Как дела? Всё хорошо.",
    "emoji 🚀🔥 and math ∑∫√",
    "x" * 300,
    "supercalifragilistic" * 10,
    LONG,
    LONG[: len(LONG) // 2],
    "def f(x):\n    return x ** 2  # code",
    "   spaces   and\ttabs\n\nnewlines   ",
]
DTYPES = ("int8", "bfloat16", "float32")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _entries(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "embedders").glob("*.pt"))


def _build(dtype: str) -> tuple[Embedder, np.ndarray]:
    emb = Embedder(dtype=dtype)
    vecs = emb.encode(TEXTS)
    emb.close()
    return emb, vecs


@pytest.mark.parametrize("dtype", DTYPES)
def test_warm_build_equals_cold_build(cache_dir: Path, dtype: str) -> None:
    cold, cold_vecs = _build(dtype)
    assert len(_entries(cache_dir)) == 1
    model_id, path = resolve_embedder_path("all-minilm-l6-v2")
    assert encoder_store.load(path, model_id, dtype) is not None
    warm, warm_vecs = _build(dtype)
    assert np.array_equal(warm_vecs, cold_vecs)
    assert (warm.dims, warm.max_tokens, warm.model_id) == (
        cold.dims,
        cold.max_tokens,
        cold.model_id,
    )
    assert warm.fits(LONG) == cold.fits(LONG) is False
    assert warm.fits(TEXTS[2]) == cold.fits(TEXTS[2]) is True


def test_warm_start_in_a_fresh_process_skips_sentence_transformers(cache_dir: Path) -> None:
    parent = Embedder()
    vec = parent.encode([TEXTS[5]])[0]
    parent.close()
    code = (
        "from cache import Embedder\n"
        "emb = Embedder()\n"
        f"result = emb.encode([{TEXTS[5]!r}])[0].tolist()\n"
        "emb.close()\n"
    )
    assert in_fresh_process(code, cache_dir) == {"result": vec.tolist(), "imported": []}


def test_corrupt_entry_is_rebuilt(cache_dir: Path) -> None:
    _, cold_vecs = _build("int8")
    (entry,) = _entries(cache_dir)
    entry.write_bytes(b"not a torchscript file" * 100)
    _, rebuilt_vecs = _build("int8")
    assert np.array_equal(rebuilt_vecs, cold_vecs)
    model_id, path = resolve_embedder_path("all-minilm-l6-v2")
    assert encoder_store.load(path, model_id, "int8") is not None  # rewritten


def test_stale_or_other_dtype_misses(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _build("float32")
    model_id, path = resolve_embedder_path("all-minilm-l6-v2")
    assert encoder_store.load(path, model_id, "float32") is not None
    assert encoder_store.load(path, model_id, "bfloat16") is None
    paths = {encoder_store.entry_path(path, model_id, d) for d in DTYPES}
    assert len(paths) == len(DTYPES)
    monkeypatch.setattr(encoder_store, "FORMAT", encoder_store.FORMAT + 1)
    assert encoder_store.load(path, model_id, "float32") is None


def test_key_follows_the_model_files(tmp_path: Path) -> None:
    _, source = resolve_embedder_path("all-minilm-l6-v2")
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(source / name, model / name)
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    key = encoder_store.entry_key(model, "m", "int8")
    assert encoder_store.entry_key(model, "m", "int8") == key
    assert encoder_store.entry_key(model, "m", "float32") != key
    weights = model / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    touched = encoder_store.entry_key(model, "m", "int8")
    assert touched != key
    (model / "config.json").write_text("{}")
    assert encoder_store.entry_key(model, "m", "int8") != touched


def test_unwritable_cache_only_costs_the_reuse(unwritable_cache_dir: Path) -> None:
    emb = Embedder(dtype="float32")
    assert emb.encode(["still works"]).shape == (1, emb.dims)
    emb.close()

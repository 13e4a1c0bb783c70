"""The GGUF parse kept on disk (engine/gguf_index.py): a warm load gives what a parse gives."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from engine.config import resolve_model_path
from engine.disk_cache import cache_dir
from engine.gguf_index import entry_path, read_gguf
from engine.loader import load_model_files, load_tokenizer

MODEL = resolve_model_path("smollm2-135m-instruct")
TEXTS = ["Hello, world!", "naïve café — 東京 🚀", "<|im_start|>user\nHi<|im_end|>", "  \t\n"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    return Path(shutil.copy2(MODEL, tmp_path / MODEL.name))


def _entry(path: Path) -> dict[str, Any]:
    return json.loads(entry_path(path).read_text())


@pytest.fixture(scope="module")
def reader() -> GGUFReader:
    """gguf's own parse of the bundled model."""
    return GGUFReader(MODEL)


def _assert_same_as(reader: GGUFReader) -> None:
    """read_gguf's metadata and tensors are gguf's own parse, value for value and byte
    for byte (dtype and shape included)."""
    ours = read_gguf(MODEL)
    assert ours.metadata == {name: f.contents() for name, f in reader.fields.items()}
    assert [type(v) for v in ours.metadata.values()] == [
        type(f.contents()) for f in reader.fields.values()
    ]
    assert len(ours.tensors) == len(reader.tensors)
    for mine, theirs in zip(ours.tensors, reader.tensors, strict=True):
        assert (mine.name, mine.tensor_type) == (theirs.name, theirs.tensor_type)
        assert mine.shape == theirs.shape.tolist()
        assert (mine.data.dtype, mine.data.shape) == (theirs.data.dtype, theirs.data.shape)
        assert np.array_equal(mine.data, theirs.data)


def test_a_warm_load_gives_what_a_cold_load_gives(cache: Path) -> None:
    cold_config, cold_weights, cold_tokenizer = load_model_files(MODEL)
    assert entry_path(MODEL).parent == cache / "gguf" and entry_path(MODEL).is_file()
    config, weights, tokenizer = load_model_files(MODEL)
    assert config == cold_config
    assert weights.keys() == cold_weights.keys()
    assert all(torch.equal(weights[name], cold_weights[name]) for name in weights)
    warm_tokenizer = load_tokenizer(MODEL)
    for text in TEXTS:
        expected = cold_tokenizer.encode(text)
        assert tokenizer.encode(text) == warm_tokenizer.encode(text) == expected
        assert tokenizer.decode(expected) == cold_tokenizer.decode(expected)
    assert tokenizer.eos_token_ids == cold_tokenizer.eos_token_ids
    assert tokenizer.chat_template == cold_tokenizer.chat_template


def test_cold_and_warm_reads_equal_gguf_readers_parse(cache: Path, reader: GGUFReader) -> None:
    _assert_same_as(reader)  # cold: parsed, entry written
    assert entry_path(MODEL).is_file()
    _assert_same_as(reader)  # warm


def test_a_warm_load_reads_the_entry_not_the_files_metadata(cache: Path) -> None:
    read_gguf(MODEL)
    entry = _entry(MODEL)
    entry["metadata"]["general.name"] = "from the cache"
    entry_path(MODEL).write_text(json.dumps(entry))
    assert read_gguf(MODEL).metadata["general.name"] == "from the cache"


def test_a_changed_file_misses_and_is_parsed_again(cache: Path, model_copy: Path) -> None:
    read_gguf(model_copy)
    before = _entry(model_copy)["key"]
    stat = model_copy.stat()
    os.utime(model_copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    entry = _entry(model_copy)
    entry["metadata"]["general.name"] = "stale"  # what a hit would return
    entry_path(model_copy).write_text(json.dumps(entry))
    assert read_gguf(model_copy).metadata["general.name"] != "stale"
    after = _entry(model_copy)["key"]
    assert after["mtime_ns"] == before["mtime_ns"] + 1_000_000_000
    assert after["path"] == before["path"] == str(model_copy.resolve())
    assert len(list((cache / "gguf").iterdir())) == 1  # rewritten in place


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda text: "\x00garbage\xff" * 100,
        lambda text: text[: len(text) // 2],
        lambda text: "[]",
        lambda text: text.replace('"offset": ', '"offset": 99', 1),  # past the end
    ],
    ids=["garbage", "truncated", "not-an-entry", "bad-offset"],
)
def test_a_corrupt_entry_falls_back_to_parsing(
    cache: Path, reader: GGUFReader, corrupt: Callable[[str], str]
) -> None:
    read_gguf(MODEL)
    good = entry_path(MODEL).read_text()
    entry_path(MODEL).write_text(corrupt(good))
    _assert_same_as(reader)
    assert entry_path(MODEL).read_text() == good  # and the entry is written again


def test_a_corrupt_entry_still_loads_the_model(cache: Path) -> None:
    expected_config, expected_weights, _ = load_model_files(MODEL)
    entry_path(MODEL).write_bytes(os.urandom(4096))
    config, weights, tokenizer = load_model_files(MODEL)
    assert config == expected_config
    assert all(torch.equal(weights[name], expected_weights[name]) for name in expected_weights)
    assert tokenizer.encode(TEXTS[1]) == load_tokenizer(MODEL).encode(TEXTS[1])


def test_an_unwritable_cache_dir_still_loads(unwritable_cache_dir: Path) -> None:
    config, _, tokenizer = load_model_files(MODEL)
    assert config.num_layers == 30
    assert load_tokenizer(MODEL).encode(TEXTS[0]) == tokenizer.encode(TEXTS[0])
    assert unwritable_cache_dir.read_text() == "not a directory"


def test_the_cache_dir_follows_the_xdg_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEMGATE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "semgate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "semgate"

"""The GGUF file's metadata and tensor directory, parsed once and kept on disk.

gguf's GGUFReader takes over a second to parse the bundled model's metadata (a numpy
view per string of a 49k-token vocabulary and 48.9k merges): more than half of a load,
paid by every process that loads the model or its tokenizer (the gateway and the engine
core at each start, each engine of the tests). What the parse gives is kept as JSON,
keyed by the file's resolved path, size and mtime; a later load reads that and maps the
file, each tensor a view at its offset. Entries live in gguf/ under
engine.disk_cache.cache_dir()."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, GGUFReader

from engine.disk_cache import cache_dir, write_atomically

FORMAT = 1  # an entry's layout; a change makes older entries miss


class GGUFTensor(NamedTuple):
    """What the loader reads of gguf's ReaderTensor, the same values."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: list[int]  # GGUF order, innermost dimension first
    data: np.ndarray  # the tensor's bytes in the file, typed and shaped as GGUFReader's


class GGUFIndex(NamedTuple):
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


class _GGUFReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memmap.

    Slicing a np.memmap runs memmap.__array_finalize__ on every view; the reader
    takes ~10^6 views to parse a 49k-token vocabulary, which triples its time.
    """

    # The ignore: GGUFReader types `data` as its memmap, and a plain view is the point here.
    @property  # type: ignore[override]
    def data(self) -> npt.NDArray[Any]:
        return self._data

    @data.setter
    def data(self, value: npt.NDArray[Any]) -> None:
        self._data = value.view(np.ndarray)


def entry_path(path: Path) -> Path:
    """Where the entry of the GGUF file at `path` is kept (one per file path)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / "gguf" / f"{digest}.json"


def read_gguf(path: Path) -> GGUFIndex:
    """The file's metadata and tensors: from its entry when this file (same path, size
    and mtime) was parsed before, else parsed and the entry written."""
    path = path.resolve()
    stat = path.stat()
    key = {"format": FORMAT, "path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    where = entry_path(path)
    try:
        entry = json.loads(where.read_text())
        if entry["key"] == key:
            return _index(path, entry)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no entry, or one that cannot be read: parse the file
    entry = {"key": key, **_parse(path)}
    _store(where, entry)
    return _index(path, entry)


def _parse(path: Path) -> dict[str, Any]:
    reader = _GGUFReader(path)
    return {
        # contents() gives plain Python values (str, int, float, bool and lists of them).
        "metadata": {name: field.contents() for name, field in reader.fields.items()},
        "tensors": [
            {
                "name": t.name,
                "type": int(t.tensor_type),
                "shape": [int(d) for d in t.shape],
                "offset": t.data_offset,
                "length": t.data.nbytes,
                "dtype": t.data.dtype.str,
                "data_shape": list(t.data.shape),
            }
            for t in reader.tensors
        ],
    }


def _index(path: Path, entry: dict[str, Any]) -> GGUFIndex:
    data = np.memmap(path, mode="r").view(np.ndarray)  # plain views: see _GGUFReader
    tensors = [
        GGUFTensor(
            name=t["name"],
            tensor_type=GGMLQuantizationType(t["type"]),
            shape=t["shape"],
            data=data[t["offset"] : t["offset"] + t["length"]]
            .view(np.dtype(t["dtype"]))
            .reshape(t["data_shape"]),
        )
        for t in entry["tensors"]
    ]
    return GGUFIndex(entry["metadata"], tensors)


def _store(where: Path, entry: dict[str, Any]) -> None:
    try:
        text = json.dumps(entry)
    except TypeError:  # a metadata value JSON cannot hold: this file is parsed each time
        return
    write_atomically(where, lambda temp: temp.write_text(text))

"""What semgate keeps on disk because it can rebuild it (parsed GGUF files, the labelled
sets' embeddings): where, and how an entry is written so that no reader sees half of it.
cache/encoder_store.py follows the same rule on its own (cache/ may not import engine)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """$SEMGATE_CACHE_DIR, else $XDG_CACHE_HOME/semgate, else ~/.cache/semgate."""
    if explicit := os.environ.get("SEMGATE_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "semgate"


def write_atomically(where: Path, write: Callable[[Path], object]) -> bool:
    """`write(temp)` to a file beside `where`, then renamed onto it. A cache that cannot
    be written (read-only home, a file in the way) only costs the reuse: False, and no
    temporary file is left behind."""
    temp: Path | None = None
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=where.parent, suffix=".tmp")
        os.close(fd)
        temp = Path(name)
        write(temp)
        os.replace(temp, where)
        return True
    except OSError:
        if temp is not None:
            temp.unlink(missing_ok=True)
        return False

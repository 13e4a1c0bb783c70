"""Dense layers with the fastest weight layout for the device, and the choice
between them and the quantized ones (engine/quantized_linear.py).

On CPU, MKL's plain sgemm/sgemv reaches about a third of memory bandwidth for
the skinny batches of decode (1-64 rows), while oneDNN with weights reordered
once into its own blocked layout keeps up: 2-3x faster per decode step for a
model this size. Everywhere else the weights stay a plain tensor for F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.block_quantized_linear import BlockInt4Linear, BlockInt8Linear
from engine.cpu_kernels import cpu_kernels_or_none
from engine.quantized_linear import Int4Linear, Int8Linear


def _onednn_usable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed = weight.to_mkldnn() if _onednn_usable(weight) else None
        self.weight = None if self.packed is not None else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:  # not packed for oneDNN
            return F.linear(x, self.weight, self.bias)
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features).contiguous(), self.packed, self.bias, "none", [], ""
        )
        return out.view(*shape[:-1], self.out_features)


# Each quantization's layer: the block kernels (int8 activations, AVX-512 VNNI) where
# this CPU has them, else aten's weight-only kernels over bfloat16 activations.
QUANTIZED: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "int8": (BlockInt8Linear, Int8Linear),
    "int4": (BlockInt4Linear, Int4Linear),
}


def build_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, quantization: str | None = None
) -> nn.Module:
    """A linear layer over weight ([out, in]) in the given quantization (None: as is)."""
    if quantization is None:
        return Linear(weight, bias)
    if quantization not in QUANTIZED:
        choices = [None, *QUANTIZED]
        raise ValueError(f"quantization must be one of {choices}, not {quantization!r}")
    block_kernels, fallback = QUANTIZED[quantization]
    return (block_kernels if cpu_kernels_or_none() else fallback)(weight, bias)

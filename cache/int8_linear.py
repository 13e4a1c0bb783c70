"""Int8 linear layers for the embedder and the cross-encoder, on plain int8 tensors and
`torch._int_mm`.

Weights are quantised once, per output channel (symmetric, scale = max |w| / 127);
activations on the fly, per row (each token of each text its own scale), so a text's
vector does not depend on what else is in its batch. The int8 product accumulates in
int32 and is rescaled to float32. This replaces torch.ao's dynamic quantisation, whose
quantized tensors (`quantize_per_tensor` and the rest) torch 2.13 deprecates: it used
per-tensor activation scales, so its vectors differ a little (see docs/cache.md).
"""

from __future__ import annotations

from typing import TypeVar

import torch


def int8_kernels() -> bool:
    """Whether torch multiplies int8 matrices on this CPU (`torch._int_mm`)."""
    try:
        torch._int_mm(torch.ones(1, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8))
    except RuntimeError:
        return False
    return True


def _per_row_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows and their scales: row * scale ~ x."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


class Int8Linear(torch.nn.Module):
    """y = x W^T + b with W and each row of x in int8."""

    # Buffers (registered in __init__), which nn.Module's attribute lookup types loosely.
    weight_t: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        quantized, scale = _per_row_int8(weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Stored transposed and contiguous: _int_mm multiplies (m, k) by (k, n).
        self.register_buffer("weight_t", quantized.t().contiguous())
        self.register_buffer("weight_scale", scale.reshape(1, -1))
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        quantized, scale = _per_row_int8(rows)
        out = torch._int_mm(quantized, self.weight_t).float() * scale * self.weight_scale
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


M = TypeVar("M", bound=torch.nn.Module)


def quantize_linears(module: M) -> M:
    """Replaces every nn.Linear inside `module` with an Int8Linear, in place."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_linears(child)
    return module

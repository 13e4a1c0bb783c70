"""Linear layers with quantized weights on aten's kernels: the fallback where semgate's
block kernels (engine/block_quantized_linear.py) cannot run (no AVX-512 VNNI, no C
compiler).

Decode reads every weight once a token, so fewer bytes a weight is the lever;
but on CPU the kernel matters more than the format (docs/engine.md has the
measurements). Both layers here are weight-only, over bfloat16 activations:
aten's int8 and int4 CPU kernels are fast only for bfloat16 inputs (with float32
ones 2-15x slower than float32 weights). Weight-only also keeps each row's result
independent of the other rows in the batch, so quantized greedy output does not
depend on scheduling. fbgemm's dynamic int8 (int8 activations with one scale a
call) was faster but broke both: outlier channels entering the MLP's down
projection (up to 700x the median) wiped out the other channels' precision
(perplexity 1.77x float32's), and a row's scale depended on its batch.

- int8: symmetric int8 weights, one scale per output channel.
- int4: asymmetric groups of 32 along the input (GGUF's Q4_0/Q4_1 block size, so
  a Q4_1 file's blocks map onto it exactly).
"""

from __future__ import annotations

import torch
from torch import nn

BLOCK = 32  # inputs sharing a scale: GGUF's Q4 and Q8 block, so a Q4_1 grid maps exactly


class _WeightOnlyLinear(nn.Module):
    """What both layers share: rows flattened and cast to bfloat16 for the kernel,
    float bias added after, the caller's dtype and leading dimensions restored."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float()

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, in] bfloat16 -> [rows, out]."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = self._matmul(x.reshape(-1, self.in_features).bfloat16()).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features)


class Int8Linear(_WeightOnlyLinear):
    """Symmetric int8 weights per output channel, bfloat16 activations (weight-only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight, bias)
        scales = (weight.float().abs().amax(dim=1) / 127).clamp(min=1e-12)
        self.qweight = torch.round(weight.float() / scales[:, None]).to(torch.int8)
        self.scales = scales.bfloat16()

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)


def quantize_blocks(
    weight: torch.Tensor, levels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q in 0..levels as uint8 [out, in], scale, minimum [out, blocks], both fp16): each
    block's minimum at q = 0 and its maximum at q = levels, as llama.cpp's Q4_1. A
    4-bit grid (max - min = 15 steps) is exact in 4 bits, and in 8 (255 = 17 x 15)."""
    out, in_features = weight.shape
    blocks = weight.float().view(out, in_features // BLOCK, BLOCK)
    low = blocks.amin(dim=-1).half()
    scale = ((blocks.amax(dim=-1) - low.float()) / levels).half()
    safe = torch.where(scale > 0, scale.float(), 1.0)
    q = torch.round((blocks - low.float()[..., None]) / safe[..., None]).clamp(0, levels)
    return q.to(torch.uint8).view(out, in_features), scale, low


class Int4Linear(_WeightOnlyLinear):
    """4-bit weights in groups of 32 (scale and minimum per group), bfloat16 activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight, bias)
        if self.in_features % BLOCK:
            raise ValueError(f"int4 needs in_features divisible by {BLOCK}")
        q, half_scale, half_low = quantize_blocks(weight, 15)
        scale, low = half_scale.float(), half_low.float()
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        # The kernel computes (q - 8) * scale + zero: zero is the group's value at q = 8.
        zero = low + 8 * scale
        self.scales_and_zeros = (
            torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().bfloat16()
        )

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, BLOCK, self.scales_and_zeros
        )

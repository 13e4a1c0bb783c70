"""Linear layers over block-quantized weights with int8 activations, on the kernels of
engine/kernels/block_dot.c (AVX-512 VNNI), as llama.cpp multiplies its Q4/Q8 blocks.

Each block of 32 inputs has its own fp16 scale and minimum, as GGUF's Q4_1 blocks,
so a Q4_1 file's weights come back exactly in 4 bits (in 8, up to the fp16 rounding
of scale / 17). The activations are quantized per row and per block of 32 inside
the kernel; a block's own scale keeps an outlier channel (up to 700x the median,
entering the MLP's down projection) from erasing the other 31's precision, which
is what sank a single scale per call (docs/engine.md).

The weights are packed 16 output channels abreast; the kernel's comment says
where each byte goes.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.cpu_kernels import cpu_kernels
from engine.quantized_linear import BLOCK, quantize_blocks

LANES = 16  # outputs packed abreast: the 16 int32 lanes of an AVX-512 register


def _padded(t: torch.Tensor) -> torch.Tensor:
    """Rows padded with zeros to a multiple of LANES (a zero scale makes a zero output)."""
    extra = -t.shape[0] % LANES
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra else t


def _lanes_abreast(per_channel: torch.Tensor) -> torch.Tensor:
    """[out, blocks] -> [tiles, blocks, LANES]: a tile's 16 channels side by side."""
    out, blocks = per_channel.shape
    return per_channel.view(out // LANES, LANES, blocks).transpose(1, 2)


def _scales(scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """[tiles, blocks, 2, 16]: a tile's 16 scales, then its 16 minimums, for each block."""
    return torch.stack([_lanes_abreast(scale), _lanes_abreast(low)], dim=2).contiguous()


def pack_int4(
    q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes [tiles, blocks, 4 chunks, 16 lanes, 4]: chunk c's low nibbles are a lane's
    inputs 8c..8c+3, its high nibbles 8c+4..8c+7."""
    out, in_features = q.shape
    nibbles = q.view(out // LANES, LANES, in_features // BLOCK, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
    packed = nibbles[..., 0] | (nibbles[..., 1] << 4)
    return packed.contiguous(), _scales(scale, low)


def pack_int8(
    q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes [tiles, blocks, 8 chunks, 16 lanes, 4]: chunk c holds a lane's inputs 4c..4c+3."""
    out, in_features = q.shape
    packed = q.view(out // LANES, LANES, in_features // BLOCK, 8, 4).permute(0, 2, 3, 1, 4)
    return packed.contiguous(), _scales(scale, low)


class _BlockQuantizedLinear(nn.Module):
    kernel_name: str

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if self.in_features % BLOCK:
            raise ValueError(f"block quantization needs in_features divisible by {BLOCK}")
        self.bias = None if bias is None else bias.float()
        self.padded_out = weight.shape[0] + -weight.shape[0] % LANES
        self.kernel = getattr(cpu_kernels(), self.kernel_name)
        self.packed, self.scales = self._pack(_padded(weight.float()))

    def _pack(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, self.in_features, gated=False)

    def forward_swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """self(silu(gate) * up) for gate_up = [..., gate | up], the product made while
        the kernel quantizes its input: one call where aten takes four ops."""
        return self._run(gate_up, 2 * self.in_features, gated=True)

    def _run(self, x: torch.Tensor, width: int, gated: bool) -> torch.Tensor:
        # A decode step makes 120 of these calls: a 2-D float32 input (the usual case)
        # goes to the kernel as it is.
        plain = x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous()
        rows = x if plain else x.reshape(-1, width).float().contiguous()
        out = torch.empty(rows.shape[0], self.padded_out)
        failed = self.kernel(
            rows.data_ptr(), rows.shape[0], self.in_features, self.padded_out,
            self.packed.data_ptr(), self.scales.data_ptr(), out.data_ptr(), gated,
        )  # fmt: skip
        if failed:
            raise MemoryError(f"{self.kernel_name}: no scratch memory for {rows.shape[0]} rows")
        if self.padded_out != self.out_features:
            out = out[:, : self.out_features]
        if self.bias is not None:
            out = out + self.bias
        return out if plain else out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class BlockInt4Linear(_BlockQuantizedLinear):
    """4-bit weights, scale and minimum per block of 32 (Q4_1), int8 activations."""

    kernel_name = "int4_matmul"

    def _pack(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return pack_int4(*quantize_blocks(weight, 15))


class BlockInt8Linear(_BlockQuantizedLinear):
    """8-bit weights, scale and minimum per block of 32, int8 activations."""

    kernel_name = "int8_matmul"

    def _pack(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return pack_int8(*quantize_blocks(weight, 255))

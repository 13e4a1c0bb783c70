"""The block-quantized layers (engine/kernels/block_dot.c) on the bundled model's weights:
the packing against a reference written in torch, float32 within tolerance, and each
row's bits independent of its batch and of the thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.block_quantized_linear import BlockInt4Linear, BlockInt8Linear
from engine.config import resolve_model_path
from engine.linear import build_linear
from engine.loader import load_gguf
from engine.quantized_linear import BLOCK, quantize_blocks
from tests.engine.conftest import needs_kernels

pytestmark = needs_kernels


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    _, w, _ = load_gguf(resolve_model_path("smollm2-135m-instruct"))
    return {name: w[f"layers.5.{name}"] for name in ("q", "k", "gate", "down")}


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).norm() / ref.norm()).item()


def _quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernel does to its input: int8 per block of 32, scale = max |x| / 127."""
    blocks = x.view(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    return q, amax / 127


def _reference(x: torch.Tensor, dequantized: torch.Tensor) -> torch.Tensor:
    """The kernel's sum in float64: quantized activations times the dequantized weights."""
    q, scale = _quantized_rows(x)
    return F.linear((q * scale).reshape(x.shape).double(), dequantized.double()).float()


def _dequantized(weight: torch.Tensor, levels: int) -> torch.Tensor:
    q, scale, low = quantize_blocks(weight, levels)
    blocks = q.view(weight.shape[0], -1, BLOCK).float()
    return (blocks * scale.float()[..., None] + low.float()[..., None]).view(weight.shape)


def test_both_widths_keep_the_q4_1_weights_of_the_file(weights):
    # The bundled GGUF is Q4_1: min/max requantization finds its blocks' very grid; in 8
    # bits the step is a 17th of the file's, rounded to fp16 (11 bits).
    for w in weights.values():
        assert torch.equal(_dequantized(w, 15), w)
        assert _relative_error(_dequantized(w, 255), w) < 2e-3


@pytest.mark.parametrize("rows", [1, 3, 5, 64])
def test_the_packed_layers_compute_what_their_blocks_say(weights, rows):
    # A byte in the wrong place would cost whole percent; the sums agree to float32.
    torch.manual_seed(rows)
    for w in weights.values():
        x = torch.randn(rows, w.shape[1])
        assert _relative_error(BlockInt4Linear(w)(x), _reference(x, _dequantized(w, 15))) < 1e-5
        assert _relative_error(BlockInt8Linear(w)(x), _reference(x, _dequantized(w, 255))) < 1e-5


# Relative error against float32, int8 activations included: measured about 0.5% on
# the file's weights, in either width (a random matrix is not on a 4-bit grid).
TOLERANCE = 0.01


@pytest.mark.parametrize("layer", [BlockInt4Linear, BlockInt8Linear])
def test_the_layers_match_float32(weights, layer):
    torch.manual_seed(0)
    for w in weights.values():
        x = torch.randn(7, w.shape[1])
        assert _relative_error(layer(w)(x), F.linear(x, w)) < TOLERANCE


@pytest.mark.parametrize("layer", [BlockInt4Linear, BlockInt8Linear])
def test_a_rows_bits_do_not_depend_on_its_batch_or_the_threads(weights, layer):
    linear = layer(weights["gate"])
    x = torch.randn(40, linear.in_features)
    whole = linear(x)
    for start in range(0, 40, 3):
        for stop in range(start + 1, 41, 5):
            assert torch.equal(linear(x[start:stop]), whole[start:stop])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(linear(x), whole)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_bias_leading_dimensions_and_outputs_not_a_multiple_of_16(weights, mode):
    w = weights["k"][:100]  # 100 outputs: padded to 112 inside, cut back after
    bias = torch.randn(100)
    x = torch.randn(2, 3, w.shape[1])
    out = build_linear(w, bias, mode)(x)
    assert out.shape == (2, 3, 100)
    assert _relative_error(out, F.linear(x, w, bias)) < 0.015


def test_a_width_not_a_multiple_of_the_block_is_refused():
    with pytest.raises(ValueError, match="divisible by 32"):
        BlockInt4Linear(torch.randn(16, 40))


@pytest.mark.parametrize("layer", [BlockInt4Linear, BlockInt8Linear])
def test_the_fused_swiglu_input_is_silu_of_gate_times_up(weights, layer):
    down = layer(weights["down"])
    gate_up = torch.randn(5, 2 * down.in_features) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    fused, spelled_out = down.forward_swiglu(gate_up), down(F.silu(gate) * up)
    # The kernel's exponential is within about an ulp of aten's, which may move an
    # activation to the next int8 level now and then: close, not bit-identical.
    assert _relative_error(fused, spelled_out) < 1e-3
    assert torch.equal(down.forward_swiglu(gate_up[2:3]), fused[2:3])

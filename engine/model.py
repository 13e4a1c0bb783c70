"""The Llama family (Llama, SmolLM, Mistral, Qwen2, Qwen3) over a flat batch of tokens.

One forward takes the tokens of many sequences concatenated (decodes and prefill
chunks alike); attention is the only place that needs to know where each
sequence starts, and it gets that from the backend's metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend
from engine.cpu_kernels import cpu_kernel
from engine.linear import build_linear


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int


# The LM head in each quantization: int8 in both quantized modes. A GGUF file's
# tied embedding is usually Q8_0 or better, which 4 bits would coarsen.
_HEAD_QUANTIZATION: dict[str | None, str | None] = {None: None, "int8": "int8", "int4": "int8"}


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        # On a float32 CPU model, semgate's kernel: aten's F.rms_norm is composite on
        # CPU (about eight ops, and a token takes 61 norms).
        self.kernel = cpu_kernel("rms_norm", weight.device, weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is None:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        rows = x.contiguous()
        out = torch.empty_like(rows)
        width = self.weight.shape[0]
        self.kernel(
            rows.data_ptr(), rows.numel() // width, width, self.weight.data_ptr(), self.eps,
            out.data_ptr(),
        )  # fmt: skip
        return out


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with cos/sin tables precomputed for every position."""

    # Buffers (registered in __init__), which nn.Module's attribute lookup types loosely.
    cos: torch.Tensor
    signed_sin: torch.Tensor

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", torch.cat([freqs, freqs], dim=-1).cos(), persistent=False)
        # rotate_half(x) * sin == roll(x, half) * [-sin, sin]: the sign lives in the
        # table, so a rotation is a roll, two multiplies and an add.
        signed = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
        self.register_buffer("signed_sin", signed, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        """cos and signed sin for a step's positions: looked up once per step."""
        cos = self.cos[positions].to(dtype)
        return RopeTables(
            cos, self.signed_sin[positions].to(dtype), cpu_kernel("rope", cos.device, cos.dtype)
        )


@dataclass(frozen=True)
class RopeTables:
    cos: torch.Tensor  # [tokens, head_dim]
    signed_sin: torch.Tensor
    kernel: Callable[..., Any] | None  # semgate's CPU kernel, bit-identical to apply_rope

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, heads, head_dim] rotated to its tokens' positions, contiguous."""
        tokens, heads, dim = x.shape
        if self.kernel is None or dim % 32 or x.stride(2) != 1 or x.stride(1) != dim:
            return apply_rope(x, self.cos.unsqueeze(1), self.signed_sin.unsqueeze(1))
        out = torch.empty(tokens, heads, dim)
        self.kernel(
            x.data_ptr(), x.stride(0), tokens, heads, dim, self.cos.data_ptr(),
            self.signed_sin.data_ptr(), out.data_ptr(),
        )  # fmt: skip
        return out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    # Not torch.addcmul: its vectorized loop fuses the multiply-add and its scalar loop
    # does not, so a row's result would depend on the batch's shape (and, through
    # bfloat16 activations, the greedy tokens on the batch).
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, w: dict[str, torch.Tensor], quantization: str | None
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(w["attn_norm"], cfg.rms_norm_eps)
        self.mlp_norm = RMSNorm(w["mlp_norm"], cfg.rms_norm_eps)
        # q, k and v in one matmul, gate and up in another: fewer, larger kernels.
        qkv_bias = torch.cat([w["q_bias"], w["k_bias"], w["v_bias"]]) if "q_bias" in w else None
        self.qkv = build_linear(torch.cat([w["q"], w["k"], w["v"]]), qkv_bias, quantization)
        self.q_norm = RMSNorm(w["q_norm"], cfg.rms_norm_eps) if "q_norm" in w else None
        self.k_norm = RMSNorm(w["k_norm"], cfg.rms_norm_eps) if "k_norm" in w else None
        self.o = build_linear(w["o"], None, quantization)
        self.gate_up = build_linear(torch.cat([w["gate"], w["up"]]), None, quantization)
        self.down = build_linear(w["down"], None, quantization)
        # silu(gate) * up fused into the down projection where its layer can (the block
        # kernels); spelled out in aten elsewhere.
        self.swiglu_down = getattr(self.down, "forward_swiglu", self._swiglu_down)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        attention: AttentionBackend,
        kv_cache: torch.Tensor,
        attn_meta: Any,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv(self.attn_norm(x))
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(n, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat(
                [self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])], dim=1
            )
        # q and k heads side by side: one RoPE pass rotates both.
        q, k = rope.rotate(qk).split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        attn = attention.forward(q, k, v, kv_cache, attn_meta)
        x = x + self.o(attn)
        return x + self.swiglu_down(self.gate_up(self.mlp_norm(x)))

    def _swiglu_down(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class CausalLM(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        max_positions: int,
        device: torch.device,
        dtype: torch.dtype,
        quantization: str | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg
        weights = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.embed = _param(weights["embed"])
        # Tied embeddings when the file has no separate output matrix.
        self.lm_head = build_linear(
            weights.get("lm_head", weights["embed"]), None, _HEAD_QUANTIZATION[quantization]
        )
        self.norm = RMSNorm(weights["norm"], cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, max_positions).to(device)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, _layer_weights(weights, i), quantization)
            for i in range(cfg.num_layers)
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        kv_caches: list[torch.Tensor],
        attn_meta: Any,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """Hidden states after the first num_layers layers (default all) and the final
        norm: with fewer layers, the shallow self-draft of speculative decoding."""
        x = F.embedding(input_ids, self.embed)
        rope = self.rope.tables(positions, x.dtype)
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        for layer, kv_cache in zip(layers, kv_caches[: len(layers)], strict=True):
            x = layer(x, rope, attention, kv_cache, attn_meta)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def _layer_weights(weights: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    prefix = f"layers.{index}."
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}

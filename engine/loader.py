"""Load weights, model config and tokenizer from a GGUF file or a Hugging Face directory."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from safetensors import safe_open

from engine.gguf_index import GGUFTensor, read_gguf
from engine.model import ModelConfig
from engine.tokenizer import Tokenizer

# Architectures whose GGUF q/k rows llama.cpp permuted for its interleaved RoPE.
_PERMUTED_QK_ARCHS = {"llama", "mistral"}
_SUPPORTED_ARCHS = {"llama", "mistral", "qwen2", "qwen3"}
_HF_ARCHS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

# GGUF tensor names -> ours. Layer tensors are "blk.{i}.<name>" -> "layers.{i}.<ours>".
_GGUF_GLOBAL = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
}
_GGUF_LAYER = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "attn_output.weight": "o",
    "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
}
_HF_GLOBAL = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "norm",
    "lm_head.weight": "lm_head",
}
_HF_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "self_attn.o_proj.weight": "o",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}

Weights = dict[str, torch.Tensor]


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    # llama.cpp's converter interleaves each head's two RoPE halves row-wise
    # (HF rotates first half against second half); put the rows back.
    rows = w.shape[0]
    return (
        w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    )


def _dequantize(tensor: GGUFTensor) -> torch.Tensor:
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        flat = torch.from_numpy(np.array(tensor.data, dtype=np.float32))  # a copy: read-only map
    elif tensor.tensor_type in TORCH_DEQUANTIZERS:
        flat = TORCH_DEQUANTIZERS[tensor.tensor_type](torch.from_numpy(np.array(tensor.data)))
    else:
        flat = torch.from_numpy(np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type)))
    shape = tuple(reversed([int(d) for d in tensor.shape]))
    return flat.reshape(shape)


# The common GGUF block types in torch: about 3x faster than gguf's numpy (2 s of a
# 3 s load for the bundled model), and bit-identical to it (the same float32 q * d + m).
def _halves(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """A float16 field of each block, as float32 [blocks, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _q4_0(raw: torch.Tensor) -> torch.Tensor:
    """Blocks of 32: float16 scale, 16 bytes of nibbles (low: weights 0-15, high: 16-31)."""
    blocks = raw.reshape(-1, 18)
    qs = blocks[:, 2:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1).float() - 8
    return q * _halves(blocks, 0)


def _q4_1(raw: torch.Tensor) -> torch.Tensor:
    """Blocks of 32: float16 scale and minimum, then nibbles as in Q4_0."""
    blocks = raw.reshape(-1, 20)
    qs = blocks[:, 4:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()
    return q * _halves(blocks, 0) + _halves(blocks, 2)


def _q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Blocks of 32: float16 scale, 32 int8 weights."""
    blocks = raw.reshape(-1, 34)
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _halves(blocks, 0)


TORCH_DEQUANTIZERS = {
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q8_0: _q8_0,
}


def _rename(name: str, global_map: dict[str, str], layer_map: dict[str, str], prefix: str) -> str:
    if name in global_map:
        return global_map[name]
    if name.startswith(prefix):
        index, rest = name[len(prefix) :].split(".", 1)
        if rest in layer_map:
            return f"layers.{index}.{layer_map[rest]}"
    return ""


def load_gguf(path: Path) -> tuple[ModelConfig, Weights, Tokenizer]:
    meta, gguf_tensors = read_gguf(path)  # the parse is cached on disk: engine/gguf_index.py
    arch = meta["general.architecture"]
    if arch not in _SUPPORTED_ARCHS:
        raise ValueError(f"unsupported architecture {arch!r} in {path.name}")
    n_heads = meta[f"{arch}.attention.head_count"]
    n_kv_heads = meta.get(f"{arch}.attention.head_count_kv", n_heads)
    hidden = meta[f"{arch}.embedding_length"]
    config = ModelConfig(
        arch=arch,
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=meta[f"{arch}.feed_forward_length"],
        num_layers=meta[f"{arch}.block_count"],
        num_heads=n_heads,
        num_kv_heads=n_kv_heads,
        head_dim=meta.get(f"{arch}.attention.key_length", hidden // n_heads),
        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        max_position_embeddings=meta.get(f"{arch}.context_length", 2048),
    )
    named = [(_rename(t.name, _GGUF_GLOBAL, _GGUF_LAYER, "blk."), t) for t in gguf_tensors]
    # numpy and torch release the GIL inside dequantisation: one thread per core.
    with ThreadPoolExecutor() as pool:
        tensors = list(pool.map(_dequantize, [t for name, t in named if name]))
    weights = dict(zip([name for name, _ in named if name], tensors, strict=True))
    if arch in _PERMUTED_QK_ARCHS:
        for i in range(config.num_layers):
            weights[f"layers.{i}.q"] = _unpermute(weights[f"layers.{i}.q"], n_heads)
            weights[f"layers.{i}.k"] = _unpermute(weights[f"layers.{i}.k"], n_kv_heads)
    return config, weights, Tokenizer.from_gguf_metadata(meta)


def load_hf_dir(path: Path) -> tuple[ModelConfig, Weights, Tokenizer]:
    cfg = _hf_config(path)
    names = cfg.get("architectures") or []
    arch = next((_HF_ARCHS[a] for a in names if a in _HF_ARCHS), None)
    if arch is None and cfg.get("model_type") in _SUPPORTED_ARCHS:
        arch = cfg["model_type"]
    if arch is None:
        raise ValueError(f"unsupported architectures {cfg.get('architectures')} in {path}")
    # transformers 5 writes RoPE settings under rope_parameters; older files at the top level.
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"RoPE scaling {rope} is not supported yet")
    n_heads = cfg["num_attention_heads"]
    config = ModelConfig(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=n_heads,
        num_kv_heads=cfg.get("num_key_value_heads", n_heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta") or rope.get("rope_theta", 10000.0),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
    )
    weights: Weights = {}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {path}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = _rename(key, _HF_GLOBAL, _HF_LAYER, "model.layers.")
                if name:
                    weights[name] = f.get_tensor(key).float()
    return config, weights, _hf_tokenizer(path, cfg)


def _hf_config(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text())


def _hf_tokenizer(path: Path, cfg: dict[str, Any]) -> Tokenizer:
    """EOS ids of config.json and generation_config.json join the tokenizer's own."""
    eos: list[int] = []
    gen_file = path / "generation_config.json"
    for source in (cfg, json.loads(gen_file.read_text()) if gen_file.is_file() else {}):
        value = source.get("eos_token_id")
        eos += value if isinstance(value, list) else [value] if value is not None else []
    return Tokenizer.from_hf_dir(path, eos)


def load_model_files(path: Path) -> tuple[ModelConfig, Weights, Tokenizer]:
    return load_gguf(path) if path.suffix == ".gguf" else load_hf_dir(path)


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer alone, as load_model_files builds it; no weights are read."""
    if path.suffix == ".gguf":
        return Tokenizer.from_gguf_metadata(read_gguf(path).metadata)
    return _hf_tokenizer(path, _hf_config(path))

"""How many KV blocks an engine gets: as configured, or a share of the free memory."""

from __future__ import annotations

import torch

from engine.attention import AttentionBackend
from engine.config import EngineConfig
from engine.input_batch import BatchRow, InputBatch
from engine.kv_cache import kv_cache_bytes_per_block
from engine.model import CausalLM

MiB, GiB = 1 << 20, 1 << 30


def _size(num_bytes: int) -> str:
    return f"{num_bytes / GiB:.1f} GiB" if num_bytes >= GiB else f"{num_bytes / MiB:.1f} MiB"


def available_ram() -> int:
    """Bytes of RAM a new workload can take without swapping: the kernel's MemAvailable
    (free memory plus the page cache and slabs it can reclaim). psutil, which reads the
    same line, is no dependency of the engine."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file's "kB" are KiB
    raise RuntimeError("/proc/meminfo has no MemAvailable: set kv_cache_memory")


def share_of_ram(available: int, fraction: float, bytes_per_block: int) -> tuple[int, str]:
    """Blocks in `fraction` of `available` bytes of RAM (at least one), and their
    description for the log."""
    num_blocks = max(1, int(available * fraction) // bytes_per_block)
    return num_blocks, (
        f"{_size(num_blocks * bytes_per_block)}: {fraction:.0%} of {_size(available)} available RAM"
    )


@torch.inference_mode()
def profile_forward(
    model: CausalLM,
    config: EngineConfig,
    attention: AttentionBackend,
    block_size: int,
    num_tokens: int,
) -> None:
    """Forwards one sequence of `num_tokens` tokens (a full step's budget) over a scratch
    KV cache, with the logits of up to max_num_seqs rows: the activations the KV cache
    must leave room for."""
    cfg, bs = model.config, block_size
    num_blocks = -(-num_tokens // bs)
    kv_caches = attention.allocate_kv_cache(
        cfg.num_layers, num_blocks + 1, bs, cfg.num_kv_heads, cfg.head_dim
    )
    inputs = InputBatch(
        attention,
        bs,
        torch.device(config.device),
        max_num_tokens=num_tokens,
        max_num_seqs=1,
        max_model_len=num_tokens,
        null_block=num_blocks,
    )
    num_logits = min(num_tokens, config.max_num_seqs)
    step = inputs.build([BatchRow([0] * num_tokens, 0, list(range(num_blocks)), num_logits)])
    hidden = model(step.input_ids, step.positions, attention, kv_caches, step.attn_meta)
    model.compute_logits(hidden[step.logit_rows])


def kv_cache_num_blocks(
    config: EngineConfig,
    model: CausalLM,
    attention: AttentionBackend,
    block_size: int,
    step_tokens: int,
) -> tuple[int, str]:
    """The number of KV blocks, and their size and how it was chosen (for the start-up
    log: "1.9 GiB: 10% of 19.0 GiB available RAM").

    num_kv_blocks wins, then kv_cache_memory bytes. Otherwise, on CPU, a share of the
    available RAM (kv_cache_memory_fraction); on CUDA what gpu_memory_utilization of the
    device's memory leaves once the weights are loaded and a forward of `step_tokens`
    (the engine's step budget) has run, as vLLM sizes it: call it before anything else
    takes device memory. (The CUDA path was written without a GPU at hand: untested.)
    """
    cfg = model.config
    per_block = kv_cache_bytes_per_block(
        cfg.num_layers,
        block_size,
        cfg.num_kv_heads,
        cfg.head_dim,
        config.torch_kv_cache_dtype,
    )
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
        return num_blocks, f"{_size(num_blocks * per_block)}: num_kv_blocks"
    if config.kv_cache_memory is not None:
        num_blocks = max(1, config.kv_cache_memory // per_block)
        return num_blocks, f"{_size(num_blocks * per_block)}: kv_cache_memory"
    device = torch.device(config.device)
    if device.type != "cuda":
        return share_of_ram(available_ram(), config.kv_cache_memory_fraction, per_block)
    profile_forward(model, config, attention, block_size, step_tokens)
    torch.cuda.synchronize(device)
    # The profile's activations stay reserved in torch's caching allocator, so `free`
    # already leaves room for them; so does it for other processes on the device.
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    budget = int(total * config.gpu_memory_utilization) - in_use
    if budget < per_block:
        raise ValueError(
            f"gpu_memory_utilization={config.gpu_memory_utilization} of {_size(total)} leaves "
            f"no room for the KV cache: {_size(in_use)} is in use after loading the weights "
            "and a profile forward; raise it or set kv_cache_memory"
        )
    num_blocks = budget // per_block
    return num_blocks, (
        f"{_size(num_blocks * per_block)}: {config.gpu_memory_utilization:.0%} of "
        f"{_size(total)} GPU memory less {_size(in_use)} in use after the weights and a "
        "profile forward"
    )

"""KV cache sizing: as configured, else a share of the RAM /proc/meminfo says is available."""

from __future__ import annotations

import math
import re

import pytest
import torch

from engine import LLM, EngineConfig
from engine.kv_cache import kv_cache_bytes_per_block
from engine.kv_cache_size import (
    GiB,
    MiB,
    available_ram,
    kv_cache_num_blocks,
    profile_forward,
    share_of_ram,
)


def _bytes_per_block(llm: LLM, config: EngineConfig) -> int:
    cfg = llm.engine.model_config
    return kv_cache_bytes_per_block(
        cfg.num_layers,
        llm.engine.block_size,
        cfg.num_kv_heads,
        cfg.head_dim,
        config.torch_kv_cache_dtype,
    )


def _blocks(llm: LLM, config: EngineConfig) -> tuple[int, str]:
    engine = llm.engine
    return kv_cache_num_blocks(config, engine.model, engine.runner.attention, engine.block_size, 64)


def _meminfo_kib(field: str) -> int:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith(f"{field}:"))


def test_available_ram_is_meminfo_in_bytes():
    available = available_ram()
    assert 0 < available <= _meminfo_kib("MemTotal") * 1024
    # The machine is shared: allow for others' allocations between the two reads.
    assert available == pytest.approx(_meminfo_kib("MemAvailable") * 1024, rel=0.1)


def test_share_of_ram_counts_whole_blocks_of_the_share():
    assert share_of_ram(10 * GiB, 0.1, 1 << 20) == (
        1024,
        "1.0 GiB: 10% of 10.0 GiB available RAM",
    )
    assert share_of_ram(10 * GiB, 0.25, 3 << 20)[0] == 10 * GiB // 4 // (3 << 20)
    # At least one block, even past the share.
    assert share_of_ram(MiB, 0.1, MiB) == (1, "1.0 MiB: 10% of 1.0 MiB available RAM")


def test_explicit_blocks_win_then_explicit_bytes(llm):
    config = EngineConfig(num_kv_blocks=7, kv_cache_memory=1 << 30)
    num_blocks, how = _blocks(llm, config)
    assert num_blocks == 7 and how.endswith(": num_kv_blocks")
    per_block = _bytes_per_block(llm, config)
    config = EngineConfig(kv_cache_memory=5 * per_block + 1)
    assert _blocks(llm, config) == (5, "1.8 MiB: kv_cache_memory")
    assert _blocks(llm, EngineConfig(kv_cache_memory=1))[0] == 1


def test_cpu_default_is_a_tenth_of_available_ram(llm):
    config = EngineConfig()
    assert config.device == "cpu" and config.kv_cache_memory_fraction == 0.1
    num_blocks, how = _blocks(llm, config)
    expected = available_ram() * 0.1 / _bytes_per_block(llm, config)
    assert num_blocks == pytest.approx(expected, rel=0.1)
    assert re.fullmatch(r"[\d.]+ [MG]iB: 10% of [\d.]+ [MG]iB available RAM", how), how
    half, _ = _blocks(llm, EngineConfig(kv_cache_memory_fraction=0.05))
    assert half == pytest.approx(num_blocks / 2, rel=0.1)


@pytest.mark.parametrize("name", ["kv_cache_memory_fraction", "gpu_memory_utilization"])
@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, math.nan])
def test_fractions_outside_zero_to_one_are_a_clear_error(name, value):
    with pytest.raises(ValueError, match=rf"{name} must be in \(0, 1\]"):
        EngineConfig(**{name: value})


def test_a_whole_share_is_allowed_and_no_bytes_are_not():
    assert EngineConfig(kv_cache_memory_fraction=1.0, gpu_memory_utilization=1.0)
    with pytest.raises(ValueError, match="kv_cache_memory must be >= 1"):
        EngineConfig(kv_cache_memory=0)


def test_profile_forward_runs_a_step_that_is_not_whole_blocks(llm):
    # CUDA sizing runs it before measuring free memory; on CPU it must at least run, on
    # a scratch cache: the engine's own KV is untouched.
    first_layer = llm.engine.runner.kv_caches[0]
    before = first_layer.clone()
    engine = llm.engine
    profile_forward(engine.model, engine.config, engine.runner.attention, engine.block_size, 40)
    assert torch.equal(first_layer, before)


def test_a_bfloat16_cache_holds_twice_the_blocks_in_the_same_bytes(llm):
    model = llm.engine.model
    wide = EngineConfig(kv_cache_memory=256 * MiB, kv_cache_dtype="float32")
    narrow = EngineConfig(kv_cache_memory=256 * MiB)
    assert narrow.kv_cache_dtype == "bfloat16"  # auto, for a float32 model on CPU
    assert EngineConfig(dtype="bfloat16").kv_cache_dtype == "bfloat16"  # the model's
    assert _blocks(llm, narrow)[0] == 2 * _blocks(llm, wide)[0]
    attention = llm.engine.runner.attention
    profile_forward(model, narrow, attention, 16, 40)  # a step over a scratch bfloat16 cache runs
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32"):
        EngineConfig(kv_cache_dtype="fp8")

"""The backend registry: what each backend supports and why not, what "auto" picks, the
block size each asks for, and that no backend allocates a tensor when it builds a
step's metadata."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.attention import AttentionSpec
from engine.attention_backends import BACKENDS, select_attention_backend
from engine.config import EngineConfig
from engine.cpu_kernels import cpu_kernels_or_none
from engine.input_batch import BatchRow, InputBatch
from tests.engine.conftest import needs_kernels

CPU = torch.device("cpu")
F32 = AttentionSpec(CPU, torch.float32, torch.float32, 64)


@needs_kernels
def test_auto_takes_the_cpu_kernel_for_a_float32_model_on_this_cpu():
    assert select_attention_backend("auto", F32).name == "cpu"
    bf16_kv = AttentionSpec(CPU, torch.float32, torch.bfloat16, 64)
    assert select_attention_backend("auto", bf16_kv).name == "cpu"


def test_auto_falls_back_to_sdpa_where_no_kernel_runs():
    bf16_model = AttentionSpec(CPU, torch.bfloat16, torch.bfloat16, 64)
    assert select_attention_backend("auto", bf16_model).name == "torch"
    odd_dim = AttentionSpec(CPU, torch.float32, torch.float32, 72)
    assert select_attention_backend("auto", odd_dim).name == "torch"


def test_a_backend_named_for_a_model_it_cannot_serve_says_why():
    reasons = {name: cls.unsupported(F32) for name, cls in BACKENDS.items()}
    assert reasons["torch"] is None and reasons["flash_reference"] is None
    if not torch.cuda.is_available():
        assert reasons["flash"] == "needs an NVIDIA GPU"
        with pytest.raises(ValueError, match="attention backend 'flash' needs an NVIDIA GPU"):
            select_attention_backend("flash", F32)
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        select_attention_backend("xformers", F32)
    with pytest.raises(ValueError, match="attention_backend must be one of auto, flash, cpu"):
        EngineConfig(attention_backend="xformers")


def test_each_backend_names_its_block_size_and_the_engine_takes_it(make_llm):
    sizes = {name: cls.preferred_block_size for name, cls in BACKENDS.items()}
    assert sizes == {"flash": 128, "cpu": 16, "torch": 16, "flash_reference": 128}
    engine = make_llm(attention_backend="flash_reference", max_model_len=512).engine
    assert engine.block_size == 128 and engine.runner.attention.name == "flash_reference"
    assert make_llm(attention_backend="torch").engine.block_size == 16


def test_eager_is_the_default_on_a_cpu():
    assert EngineConfig().enforce_eager is True
    assert EngineConfig(enforce_eager=False).enforce_eager is False


def _backends() -> list[str]:
    names = ["torch", "flash_reference"]
    return [*names, "cpu"] if cpu_kernels_or_none() else names


@pytest.mark.parametrize("name", _backends())
def test_metadata_is_built_into_buffers_allocated_once(name):
    """Steps of other shapes (decodes, a verification, prefill chunks) build their
    metadata without allocating one tensor, and a step of the first one's size reads
    the same memory again."""
    backend = select_attention_backend(name, F32)
    inputs = InputBatch(
        backend, 16, CPU, max_num_tokens=128, max_num_seqs=8, max_model_len=512, null_block=40
    )
    steps = [
        [BatchRow([1], 36, [3, 4, 5], 1), BatchRow([2], 7, [9], 1)],
        [BatchRow([1, 2, 3, 4], 36, [3, 4, 5], 4), BatchRow(list(range(40)), 16, [6, 7, 8], 1)],
        [BatchRow(list(range(60)), 0, [10, 11, 12, 13], 1), BatchRow([5], 100, list(range(7)), 1)],
    ]
    first = _tensors(inputs.build(steps[0]).attn_meta)
    persistent = {t.untyped_storage().data_ptr() for t in _tensors(inputs, depth=3)}
    for rows in steps:
        with NewStorages() as seen:
            inputs.build(rows)
        assert seen.storages <= persistent, seen.ops
    again = _tensors(inputs.build(steps[0]).attn_meta)
    assert [(t.data_ptr(), t.shape) for t in again] == [(t.data_ptr(), t.shape) for t in first]


class NewStorages(TorchDispatchMode):
    """The storages every op's tensor outputs live in, and the ops: an op that allocates
    returns a tensor in a storage no persistent buffer owns."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor):
                self.storages.add(t.untyped_storage().data_ptr())
                self.ops.append(str(func))
        return out


def _tensors(obj: object, depth: int = 1) -> list[torch.Tensor]:
    """The tensors among obj's attributes, and (depth > 1) their attributes'."""
    found = []
    for value in vars(obj).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif depth > 1 and hasattr(value, "__dict__") and not isinstance(value, type):
            found += _tensors(value, depth - 1)
    return found

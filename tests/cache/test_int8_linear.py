"""The embedder's int8 layers: close to float, one text's result independent of its
batch, and built without torch's deprecated quantized tensors."""

from __future__ import annotations

import subprocess
import sys

import torch

from cache.int8_linear import Int8Linear, quantize_linears


def test_int8_linear_is_close_to_float_and_independent_of_the_batch():
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 1536)
    int8 = Int8Linear(linear)
    x = torch.randn(4, 7, 384)
    with torch.inference_mode():
        exact, approx = linear(x), int8(x)
        alone = int8(x[:1])
    cosine = torch.nn.functional.cosine_similarity(exact.flatten(1), approx.flatten(1))
    assert cosine.min() > 0.999
    assert torch.equal(alone, approx[:1])  # each row has its own scale


def test_quantizing_replaces_every_linear():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    quantized = quantize_linears(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == 2


def test_the_int8_embedder_starts_without_the_deprecation_warning():
    # torch prints it from C++ (stderr, not Python's warnings) the first time a quantized
    # tensor is made: a fresh process, as `make run` starts one.
    code = "from cache import Embedder; e = Embedder(dtype='int8'); e.encode(['hello']); e.close()"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert "deprecated and will be removed" not in done.stderr, done.stderr

"""semgate's small CPU kernels against aten's ops, and the library's build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_kernels import CpuKernelsUnavailable, cpu_kernels
from engine.model import RMSNorm, RotaryEmbedding, apply_rope
from tests.engine.conftest import needs_kernels


@needs_kernels
def test_rope_is_bit_identical_to_apply_rope_on_a_strided_view():
    rope = RotaryEmbedding(64, 100000.0, 4096)
    tables = rope.tables(torch.tensor([0, 5, 17, 300, 4000, 1]), torch.float32)
    assert tables.kernel is not None
    qkv = torch.randn(6, 15 * 64)
    qk = qkv.view(6, 15, 64)[:, :12]  # q and k heads inside the projection, as in a layer
    expected = apply_rope(qk, tables.cos.unsqueeze(1), tables.signed_sin.unsqueeze(1))
    assert torch.equal(tables.rotate(qk), expected)


@needs_kernels
@pytest.mark.parametrize("width", [576, 64, 40])  # hidden, a head (q/k norms), a ragged tail
def test_rms_norm_matches_aten_and_keeps_each_rows_bits(width):
    norm = RMSNorm(torch.rand(width) + 0.5, 1e-5)
    assert norm.kernel is not None
    x = torch.randn(70, width) * 4
    out = norm(x)
    assert torch.allclose(out, F.rms_norm(x, (width,), norm.weight, 1e-5), rtol=1e-5, atol=1e-6)
    assert torch.equal(norm(x[3:4]), out[3:4])  # 70 rows split among threads; 1 does not


@needs_kernels
@pytest.mark.parametrize(
    ("compiler", "reason"), [("no-such-cc", "no C compiler"), ("false", "false failed")]
)
def test_a_missing_or_failing_compiler_is_a_readable_reason_and_leaves_nothing(
    tmp_path, monkeypatch, compiler, reason
):
    monkeypatch.setenv("SEMGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", compiler)
    cpu_kernels.cache_clear()
    try:
        with pytest.raises(CpuKernelsUnavailable, match=reason):
            cpu_kernels()
    finally:
        cpu_kernels.cache_clear()
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.tmp"))

"""A persistent integer buffer written on the host and read on the device."""

from __future__ import annotations

import torch


class StagedBuffer:
    """A persistent integer buffer (int64 unless a kernel wants int32), written on the
    host through `np` and read on the device. On CUDA the host side is pinned and
    copy() sends a prefix without blocking; on CPU both sides are one tensor and copy()
    is a view. Either way a prefix of a given length is the same memory every step, as
    CUDA graph replay needs."""

    def __init__(self, size: int, device: torch.device, dtype: torch.dtype = torch.long) -> None:
        on_cpu = device.type == "cpu"
        # Zeros, not empty: unused block-table entries must still name a real block.
        self.host = torch.zeros(size, dtype=dtype, pin_memory=device.type == "cuda")
        self.np = self.host.numpy()
        self.device = self.host if on_cpu else torch.zeros(size, dtype=dtype, device=device)

    def copy(self, n: int) -> torch.Tensor:
        """The first n values, on the device."""
        if self.device is self.host:
            return self.host[:n]
        return self.device[:n].copy_(self.host[:n], non_blocking=True)

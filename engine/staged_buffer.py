"""A persistent int64 buffer written on the host and read on the device."""

from __future__ import annotations

import torch


class StagedBuffer:
    """A persistent int64 buffer, written on the host through `np` and read on the
    device. On CUDA the host side is pinned and copy() sends a prefix without
    blocking; on CPU both sides are one tensor and copy() is a view."""

    def __init__(self, size: int, device: torch.device) -> None:
        on_cpu = device.type == "cpu"
        # Zeros, not empty: unused block-table entries must still name a real block.
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=device.type == "cuda")
        self.np = self.host.numpy()
        self.device = self.host if on_cpu else torch.zeros(size, dtype=torch.long, device=device)

    def copy(self, n: int) -> torch.Tensor:
        """The first n values, on the device."""
        if self.device is self.host:
            return self.host[:n]
        return self.device[:n].copy_(self.host[:n], non_blocking=True)

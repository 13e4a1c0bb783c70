"""A persistent integer buffer written on the host and read on the device."""

from __future__ import annotations

import math

import torch

# Views kept per buffer: a steady stream of decodes asks for a handful of shapes.
MAX_VIEWS = 64


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
        # The (host, device) views of the shapes asked for lately: a step's shapes recur,
        # and making a view is a library call (a step's host time is mostly such calls).
        # Bounded: a table's shape (rows, width) takes many values over a server's life.
        self._views: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def copy(self, *shape: int) -> torch.Tensor:
        """The first n values on the device, for copy(n); copy(rows, width) views the
        first rows * width values as a [rows, width] table."""
        views = self._views.get(shape)
        if views is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            size = math.prod(shape)
            host = self.host[:size].view(shape)
            device = host if self.device is self.host else self.device[:size].view(shape)
            views = self._views[shape] = (host, device)
        host, device = views
        if device is host:
            return host
        return device.copy_(host, non_blocking=True)

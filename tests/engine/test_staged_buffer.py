"""StagedBuffer: a prefix of a given shape is the same memory every time, and the views
it keeps for recurring shapes stay few however many shapes are asked for."""

from __future__ import annotations

import torch

from engine.staged_buffer import MAX_VIEWS, StagedBuffer

CPU = torch.device("cpu")


def test_a_shape_is_a_view_of_the_buffers_first_values():
    buffer = StagedBuffer(12, CPU)
    buffer.np[:12] = range(12)
    table = buffer.copy(3, 4)
    assert table.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert buffer.copy(5).tolist() == [0, 1, 2, 3, 4]
    assert buffer.copy(3, 4).data_ptr() == table.data_ptr() == buffer.host.data_ptr()
    buffer.np[0] = 42  # written on the host, seen through the view
    assert table[0, 0].item() == 42


def test_the_views_kept_are_bounded():
    buffer = StagedBuffer(4 * MAX_VIEWS, CPU)
    buffer.np[:] = range(4 * MAX_VIEWS)
    for rows in range(1, 2 * MAX_VIEWS + 1):
        assert buffer.copy(rows, 2).tolist() == [[2 * i, 2 * i + 1] for i in range(rows)]
        assert len(buffer._views) <= MAX_VIEWS

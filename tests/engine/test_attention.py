"""The torch backend gives a query row the same bits whatever else is in the step."""

from __future__ import annotations

import torch

from engine.attention import SequenceSlice, TorchAttention

BLOCK, HEADS, KV_HEADS, DIM = 16, 9, 3, 64


def _attend(cache: torch.Tensor, seqs: list[SequenceSlice], qs: list[torch.Tensor]) -> torch.Tensor:
    """The backend's output rows; the new k/v go to a scratch slot, so the cache stays."""
    backend = TorchAttention(torch.device("cpu"))
    q = torch.cat(qs)
    n = q.shape[0]
    scratch = torch.full((n,), (cache.shape[1] - 1) * BLOCK, dtype=torch.long)
    meta = backend.build_metadata(seqs, scratch, BLOCK)
    kv = torch.zeros(n, KV_HEADS, DIM)
    return backend.forward(q, kv, kv, cache.clone(), meta).view(n, HEADS, DIM)


def test_a_prompt_chunked_and_batched_matches_it_alone():
    torch.manual_seed(0)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    table = [1, 2]
    q = torch.randn(18, HEADS, DIM)
    alone = _attend(cache, [SequenceSlice(18, 18, table)], [q])
    # Decodes of other lengths first, then our last 16 queries as a short chunk, then a
    # long chunk of another sequence: its rows must not change by one bit.
    others = [SequenceSlice(1, c, list(range(3, 3 + (c + 15) // BLOCK))) for c in (5, 40, 77)]
    seqs = [*others, SequenceSlice(16, 18, table), SequenceSlice(20, 50, [20, 21, 22, 23])]
    qs = [torch.randn(1, HEADS, DIM) for _ in others] + [q[2:], torch.randn(20, HEADS, DIM)]
    batched = _attend(cache, seqs, qs)
    assert torch.equal(batched[3:19], alone[2:])


def test_one_decode_matches_it_inside_a_batch():
    torch.manual_seed(1)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    q = torch.randn(1, HEADS, DIM)
    mine = SequenceSlice(1, 37, [4, 5, 6])
    alone = _attend(cache, [mine], [q])
    others = [SequenceSlice(1, 100, list(range(10, 17))), SequenceSlice(4, 9, [30])]
    qs = [q, torch.randn(1, HEADS, DIM), torch.randn(4, HEADS, DIM)]
    assert torch.equal(_attend(cache, [mine, *others], qs)[:1], alone)

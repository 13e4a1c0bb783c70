"""The torch backend gives a query row the same bits whatever else is in the step."""

from __future__ import annotations

import torch

from engine.attention import TorchAttention
from engine.input_batch import BatchRow, InputBatch

BLOCK, HEADS, KV_HEADS, DIM = 16, 9, 3, 64
CPU = torch.device("cpu")


def _row(query_len: int, context_len: int, block_table: list[int]) -> BatchRow:
    """A sequence with query_len new tokens that end at context_len."""
    return BatchRow([0] * query_len, context_len - query_len, block_table, 0)


def _attend(cache: torch.Tensor, rows: list[BatchRow], qs: list[torch.Tensor]) -> torch.Tensor:
    """The backend's output rows; the new k/v are the cache's own, so it stays."""
    backend = TorchAttention(CPU)
    num_blocks = cache.shape[1]
    inputs = InputBatch(
        backend, BLOCK, CPU, max_num_tokens=64, max_num_seqs=8, max_model_len=num_blocks * BLOCK
    ).build(rows)
    meta = inputs.attn_meta
    k, v = (c.view(-1, KV_HEADS, DIM)[meta.slot_mapping] for c in cache)
    q = torch.cat(qs)
    return backend.forward(q, k, v, cache.clone(), meta).view(q.shape[0], HEADS, DIM)


def test_a_prompt_chunked_and_batched_matches_it_alone():
    torch.manual_seed(0)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    table = [1, 2]
    q = torch.randn(18, HEADS, DIM)
    alone = _attend(cache, [_row(18, 18, table)], [q])
    # Decodes of other lengths first, then our last 16 queries as a short chunk, then a
    # long chunk of another sequence: its rows must not change by one bit.
    others = [_row(1, c, list(range(3, 3 + (c + 15) // BLOCK))) for c in (5, 40, 77)]
    seqs = [*others, _row(16, 18, table), _row(20, 50, [20, 21, 22, 23])]
    qs = [torch.randn(1, HEADS, DIM) for _ in others] + [q[2:], torch.randn(20, HEADS, DIM)]
    batched = _attend(cache, seqs, qs)
    assert torch.equal(batched[3:19], alone[2:])


def test_one_decode_matches_it_inside_a_batch():
    torch.manual_seed(1)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    q = torch.randn(1, HEADS, DIM)
    mine = _row(1, 37, [4, 5, 6])
    alone = _attend(cache, [mine], [q])
    others = [_row(1, 100, list(range(10, 17))), _row(4, 9, [30])]
    qs = [q, torch.randn(1, HEADS, DIM), torch.randn(4, HEADS, DIM)]
    assert torch.equal(_attend(cache, [mine, *others], qs)[:1], alone)


def test_long_contexts_keep_their_bits_beside_wider_tables():
    """Past ~195 keys SDPA's CPU kernel changes a row's bits with the key padding unless
    the padding runs to a multiple of 512 (engine/attention.py, SMALL_KEYS): a decode at
    each of these contexts, alone, with blocks held for 8 proposals, and beside a
    sequence 700 keys longer, gives the same bits."""
    torch.manual_seed(2)
    cache = torch.randn(2, 160, BLOCK, KV_HEADS, DIM)
    for context in (150, 300, 390, 480, 490, 900, 1000):
        blocks = -(-context // BLOCK)
        q = torch.randn(1, HEADS, DIM)
        alone = _attend(cache, [_row(1, context, list(range(blocks)))], [q])
        ahead = list(range(blocks + 1))  # a block more, for proposals past its end
        assert torch.equal(_attend(cache, [_row(1, context, ahead)], [q]), alone), context
        wider = _row(1, context + 700, list(range(-(-(context + 700) // BLOCK))))
        rows = [_row(1, context, list(range(blocks))), wider]
        batched = _attend(cache, rows, [q, torch.randn(1, HEADS, DIM)])
        assert torch.equal(batched[:1], alone), context

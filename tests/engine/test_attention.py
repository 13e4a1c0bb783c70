"""Both CPU backends give a query row the same bits whatever else is in the step, and
semgate's kernel computes attention itself (against float64)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import AttentionBackend, TorchAttention
from engine.attention_backends import select_attention_backend
from engine.cpu_kernels import cpu_kernels_or_none
from engine.input_batch import BatchRow, InputBatch

BLOCK, HEADS, KV_HEADS, DIM = 16, 9, 3, 64
CPU = torch.device("cpu")

needs_kernels = pytest.mark.skipif(
    cpu_kernels_or_none() is None, reason="semgate's CPU kernels need AVX-512 VNNI and a C compiler"
)


@pytest.fixture(params=["torch", pytest.param("cpu", marks=needs_kernels)])
def backend(request) -> AttentionBackend:
    if request.param == "torch":
        return TorchAttention(CPU)
    return select_attention_backend("cpu", CPU, torch.float32, DIM)


def _row(query_len: int, context_len: int, block_table: list[int]) -> BatchRow:
    """A sequence with query_len new tokens that end at context_len."""
    return BatchRow([0] * query_len, context_len - query_len, block_table, 0)


def _attend(
    backend: AttentionBackend, cache: torch.Tensor, rows: list[BatchRow], qs: list[torch.Tensor]
) -> torch.Tensor:
    """The backend's output rows; the new k/v are the cache's own, so it stays."""
    num_blocks = cache.shape[1]
    inputs = InputBatch(
        backend, BLOCK, CPU, max_num_tokens=64, max_num_seqs=8, max_model_len=num_blocks * BLOCK
    ).build(rows)
    meta = inputs.attn_meta
    k, v = (c.view(-1, KV_HEADS, DIM)[meta.slot_mapping] for c in cache)
    q = torch.cat(qs)
    return backend.forward(q, k, v, cache.clone(), meta).view(q.shape[0], HEADS, DIM)


def test_a_prompt_chunked_and_batched_matches_it_alone(backend):
    torch.manual_seed(0)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    table = [1, 2]
    q = torch.randn(18, HEADS, DIM)
    alone = _attend(backend, cache, [_row(18, 18, table)], [q])
    # Decodes of other lengths first, then our last 16 queries as a short chunk, then a
    # long chunk of another sequence: its rows must not change by one bit.
    others = [_row(1, c, list(range(3, 3 + (c + 15) // BLOCK))) for c in (5, 40, 77)]
    seqs = [*others, _row(16, 18, table), _row(20, 50, [20, 21, 22, 23])]
    qs = [torch.randn(1, HEADS, DIM) for _ in others] + [q[2:], torch.randn(20, HEADS, DIM)]
    batched = _attend(backend, cache, seqs, qs)
    assert torch.equal(batched[3:19], alone[2:])


def test_one_decode_matches_it_inside_a_batch(backend):
    torch.manual_seed(1)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    q = torch.randn(1, HEADS, DIM)
    mine = _row(1, 37, [4, 5, 6])
    alone = _attend(backend, cache, [mine], [q])
    others = [_row(1, 100, list(range(10, 17))), _row(4, 9, [30])]
    qs = [q, torch.randn(1, HEADS, DIM), torch.randn(4, HEADS, DIM)]
    assert torch.equal(_attend(backend, cache, [mine, *others], qs)[:1], alone)


def test_long_contexts_keep_their_bits_beside_wider_tables(backend):
    """Past ~195 keys SDPA's CPU kernel changes a row's bits with the key padding unless
    the padding runs to a multiple of 512 (engine/attention.py, SMALL_KEYS): a decode at
    each of these contexts, alone, with blocks held for 8 proposals, and beside a
    sequence 700 keys longer, gives the same bits."""
    torch.manual_seed(2)
    cache = torch.randn(2, 160, BLOCK, KV_HEADS, DIM)
    for context in (150, 300, 390, 480, 490, 900, 1000):
        blocks = -(-context // BLOCK)
        q = torch.randn(1, HEADS, DIM)
        alone = _attend(backend, cache, [_row(1, context, list(range(blocks)))], [q])
        ahead = list(range(blocks + 1))  # a block more, for proposals past its end
        assert torch.equal(_attend(backend, cache, [_row(1, context, ahead)], [q]), alone), context
        wider = _row(1, context + 700, list(range(-(-(context + 700) // BLOCK))))
        rows = [_row(1, context, list(range(blocks))), wider]
        batched = _attend(backend, cache, rows, [q, torch.randn(1, HEADS, DIM)])
        assert torch.equal(batched[:1], alone), context


@needs_kernels
def test_the_cpu_kernel_computes_attention():
    # A decode, a verification and a chunk over scattered blocks, against softmax(q k^T) v
    # in float64 over each token's visible keys.
    torch.manual_seed(3)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    backend = select_attention_backend("cpu", CPU, torch.float32, DIM)
    tables = [[7, 3, 9], [12], [40, 41, 2, 5]]
    shapes = [(1, 37), (4, 16), (20, 55)]  # (query_len, context_len)
    rows = [_row(*shape, table) for shape, table in zip(shapes, tables, strict=True)]
    qs = [torch.randn(len(r.token_ids), HEADS, DIM) for r in rows]
    out = _attend(backend, cache, rows, qs)
    expected = []
    for (query_len, context), table, q in zip(shapes, tables, qs, strict=True):
        keys, values = (c[table].reshape(-1, KV_HEADS, DIM).double() for c in cache)
        for j in range(query_len):
            seen = context - query_len + j + 1
            k = keys[:seen].repeat_interleave(HEADS // KV_HEADS, dim=1)  # [seen, heads, dim]
            v = values[:seen].repeat_interleave(HEADS // KV_HEADS, dim=1)
            scores = torch.einsum("hd,shd->hs", q[j].double(), k) / math.sqrt(DIM)
            expected.append(torch.einsum("hs,shd->hd", scores.softmax(-1), v))
    assert torch.allclose(out.double(), torch.stack(expected), atol=1e-5)

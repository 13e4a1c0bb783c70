"""Both CPU backends give a query row the same bits whatever else is in the step, and
semgate's kernel computes attention itself (against float64)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import AttentionBackend, AttentionSpec
from engine.attention_backends import select_attention_backend
from engine.input_batch import BatchRow, InputBatch
from tests.engine.conftest import needs_kernels

BLOCK, HEADS, KV_HEADS, DIM = 16, 9, 3, 64
CPU = torch.device("cpu")


def _backend(name: str, dim: int = DIM) -> AttentionBackend:
    return select_attention_backend(name, AttentionSpec(CPU, torch.float32, torch.float32, dim))


@pytest.fixture(params=["torch", pytest.param("cpu", marks=needs_kernels)])
def backend(request) -> AttentionBackend:
    return _backend(request.param)


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["f32-kv", "bf16-kv"])
def kv_dtype(request) -> torch.dtype:
    """What the KV cache stores (EngineConfig.kv_cache_dtype); queries stay float32."""
    return request.param


def _row(query_len: int, context_len: int, block_table: list[int]) -> BatchRow:
    """A sequence with query_len new tokens that end at context_len."""
    return BatchRow([0] * query_len, context_len - query_len, block_table, 0)


def _attend(
    backend: AttentionBackend,
    source: torch.Tensor,
    rows: list[BatchRow],
    qs: list[torch.Tensor],
    kv_dtype: torch.dtype,
) -> torch.Tensor:
    """The backend's output rows. source ([2, blocks, BLOCK, KV_HEADS, DIM]) holds each
    slot's k and v; the backend first writes every key its rows see, in its own cache
    layout and kv_dtype, then runs the step (whose new k/v are the same values again)."""
    num_blocks = source.shape[1]
    # The source's blocks, then the null block.
    kv_cache = torch.zeros(2, num_blocks + 1, *source.shape[2:], dtype=kv_dtype)

    def step(batch: list[BatchRow], q: torch.Tensor) -> torch.Tensor:
        tokens = max(sum(len(r.token_ids) for r in batch), 64)
        inputs = InputBatch(
            backend,
            BLOCK,
            CPU,
            max_num_tokens=tokens,
            max_num_seqs=8,
            max_model_len=num_blocks * BLOCK,
            null_block=num_blocks,
        )
        meta = inputs.build(batch).attn_meta
        k, v = (c.view(-1, KV_HEADS, DIM)[meta.slot_mapping] for c in source)
        return backend.forward(q, k, v, kv_cache, meta)

    for r in rows:
        seen = r.start + len(r.token_ids)
        step([_row(seen, seen, r.block_table)], torch.zeros(seen, HEADS, DIM))
    q = torch.cat(qs)
    return step(rows, q).view(q.shape[0], HEADS, DIM)


def test_a_prompt_chunked_and_batched_matches_it_alone(backend, kv_dtype):
    torch.manual_seed(0)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    table = [1, 2]
    q = torch.randn(18, HEADS, DIM)
    alone = _attend(backend, cache, [_row(18, 18, table)], [q], kv_dtype)
    # Decodes of other lengths first, then our last 16 queries as a short chunk, then a
    # long chunk of another sequence: its rows must not change by one bit.
    others = [_row(1, c, list(range(3, 3 + (c + 15) // BLOCK))) for c in (5, 40, 77)]
    seqs = [*others, _row(16, 18, table), _row(20, 50, [20, 21, 22, 23])]
    qs = [torch.randn(1, HEADS, DIM) for _ in others] + [q[2:], torch.randn(20, HEADS, DIM)]
    batched = _attend(backend, cache, seqs, qs, kv_dtype)
    assert torch.equal(batched[3:19], alone[2:])


def test_one_decode_matches_it_inside_a_batch(backend, kv_dtype):
    torch.manual_seed(1)
    cache = torch.randn(2, 64, BLOCK, KV_HEADS, DIM)
    q = torch.randn(1, HEADS, DIM)
    mine = _row(1, 37, [4, 5, 6])
    alone = _attend(backend, cache, [mine], [q], kv_dtype)
    others = [_row(1, 100, list(range(10, 17))), _row(4, 9, [30])]
    qs = [q, torch.randn(1, HEADS, DIM), torch.randn(4, HEADS, DIM)]
    assert torch.equal(_attend(backend, cache, [mine, *others], qs, kv_dtype)[:1], alone)


def test_long_contexts_keep_their_bits_beside_wider_tables(backend, kv_dtype):
    """Past ~195 keys SDPA's CPU kernel changes a row's bits with the key padding unless
    the padding runs to a multiple of 512 (engine/attention.py, SMALL_KEYS): a decode at
    each of these contexts, alone, with blocks held for 8 proposals, and beside a
    sequence 700 keys longer, gives the same bits."""
    torch.manual_seed(2)
    cache = torch.randn(2, 160, BLOCK, KV_HEADS, DIM)
    for context in (150, 300, 390, 480, 490, 900, 1000):
        blocks = -(-context // BLOCK)
        q = torch.randn(1, HEADS, DIM)
        alone = _attend(backend, cache, [_row(1, context, list(range(blocks)))], [q], kv_dtype)
        ahead = list(range(blocks + 1))  # a block more, for proposals past its end
        assert torch.equal(
            _attend(backend, cache, [_row(1, context, ahead)], [q], kv_dtype), alone
        ), context
        wider = _row(1, context + 700, list(range(-(-(context + 700) // BLOCK))))
        rows = [_row(1, context, list(range(blocks))), wider]
        batched = _attend(backend, cache, rows, [q, torch.randn(1, HEADS, DIM)], kv_dtype)
        assert torch.equal(batched[:1], alone), context


@needs_kernels
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    # SmolLM2's; plain multi-head at 128 (the other register-blocked width); a width with
    # no blocked instance; more query heads to a KV head than a group holds (16)
    [(HEADS, KV_HEADS, DIM), (4, 4, 128), (12, 2, 80), (34, 1, 32)],
)
def test_the_cpu_kernel_computes_attention(heads, kv_heads, dim, kv_dtype):
    """Three prompts over scattered blocks, attended as they are written, against
    softmax(q k^T) v in float64 over each token's visible keys (rounded as the cache
    stores them: a bfloat16 cache must round as torch does); and each prompt alone
    gives its rows the same bits as the three together."""
    torch.manual_seed(3)
    backend = _backend("cpu", dim)
    tables = [[7, 3, 9], [12], [40, 41, 2, 5]]
    lens = [37, 5, 55]

    def attend(prompts: list[int], q, k, v) -> torch.Tensor:
        rows = [_row(lens[i], lens[i], tables[i]) for i in prompts]
        inputs = InputBatch(
            backend,
            BLOCK,
            CPU,
            max_num_tokens=128,
            max_num_seqs=8,
            max_model_len=1024,
            null_block=64,
        )
        meta = inputs.build(rows).attn_meta
        kv_cache = torch.zeros(2, 65, BLOCK, kv_heads, dim, dtype=kv_dtype)
        return backend.forward(q, k, v, kv_cache, meta).view(-1, heads, dim)

    q, k, v = (torch.randn(sum(lens), h, dim) for h in (heads, kv_heads, kv_heads))
    out = attend([0, 1, 2], q, k, v)
    stored_k, stored_v = (t.to(kv_dtype).double() for t in (k, v))
    expected, start = [], 0
    for n in lens:
        for j in range(n):
            seen = slice(start, start + j + 1)
            keys = stored_k[seen].repeat_interleave(heads // kv_heads, dim=1)
            values = stored_v[seen].repeat_interleave(heads // kv_heads, dim=1)
            scores = torch.einsum("hd,shd->hs", q[start + j].double(), keys) / math.sqrt(dim)
            expected.append(torch.einsum("hs,shd->hd", scores.softmax(-1), values))
        start += n
    assert torch.allclose(out.double(), torch.stack(expected), atol=1e-5)
    start = 0
    for i, n in enumerate(lens):
        mine = slice(start, start + n)
        assert torch.equal(attend([i], q[mine], k[mine], v[mine]), out[mine])
        start += n

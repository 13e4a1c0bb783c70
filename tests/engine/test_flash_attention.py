"""The flash backend on a CPU: the plain-torch reference of flash-attn-4's
flash_attn_varlen_func against SDPA, then the backend (its metadata, its KV layout)
through the reference against the torch backend, on paged layouts with partly filled
last pages, grouped-query heads, a prefill chunk beside decodes, and speculative
verification rows. scripts/gpu-check holds the real kernel to the same reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention import AttentionSpec
from engine.attention_backends import select_attention_backend
from engine.flash_reference import flash_attn_varlen_reference
from engine.input_batch import BatchRow, InputBatch

CPU = torch.device("cpu")
HEADS, KV_HEADS, DIM = 9, 3, 64
PAGE = 16
NUM_PAGES = 40


def _paged_step(
    rows: list[tuple[int, int]], generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    """Random q and a paged cache for rows of (query_len, keys after the step), each
    sequence on scattered pages; returns q, k_cache, v_cache, cu_seqlens_q, seqused_k,
    page_table (int32, padded with page 0), max_seqlen_q."""
    order = torch.randperm(NUM_PAGES, generator=generator).tolist()
    tables = []
    for _, keys in rows:
        need = -(-keys // PAGE)
        tables.append([order.pop() for _ in range(need)])
    width = max(len(t) for t in tables)
    page_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q_lens = [q for q, _ in rows]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    used = torch.tensor([k for _, k in rows], dtype=torch.int32)
    q = torch.randn(sum(q_lens), HEADS, DIM, generator=generator)
    k = torch.randn(NUM_PAGES, PAGE, KV_HEADS, DIM, generator=generator)
    v = torch.randn(NUM_PAGES, PAGE, KV_HEADS, DIM, generator=generator)
    return q, k, v, cu, used, page_table, max(q_lens)


def _sdpa(q, k, v, cu, used, page_table) -> torch.Tensor:
    """Each sequence alone through SDPA over its gathered keys, causal to the bottom
    right (query i of q_len sees keys up to k_len - q_len + i)."""
    out = []
    for b in range(len(used)):
        n, q_len = int(used[b]), int(cu[b + 1] - cu[b])
        pages = page_table[b].long()
        keys = k[pages].flatten(0, 1)[:n].transpose(0, 1)
        values = v[pages].flatten(0, 1)[:n].transpose(0, 1)
        mask = torch.arange(n)[None, :] <= torch.arange(n - q_len, n)[:, None]
        rows = q[cu[b] : cu[b + 1]].transpose(0, 1)
        o = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, enable_gqa=True)
        out.append(o.transpose(0, 1))
    return torch.cat(out)


# Decodes whose last page is partly (or just) filled, a prefill chunk over earlier
# context, a whole prompt, and verification rows (1 token plus 3 and 7 proposals).
MIXED = [(1, 37), (1, 16), (20, 52), (13, 13), (4, 70), (8, 100), (1, 1)]


def test_the_reference_is_sdpa_per_sequence():
    gen = torch.Generator().manual_seed(0)
    q, k, v, cu, used, table, max_q = _paged_step(MIXED, gen)
    kwargs = dict(cu_seqlens_q=cu, max_seqlen_q=max_q, seqused_k=used, page_table=table)
    out, lse = flash_attn_varlen_reference(q, k, v, **kwargs, causal=True)
    assert lse is None and out.shape == q.shape and out.dtype == q.dtype
    assert torch.allclose(out, _sdpa(q, k, v, cu, used, table), atol=1e-5)


def test_pages_past_the_last_used_one_may_hold_nan_but_its_own_rows_may_not():
    """The contract (flash_attn/cute/interface.py): unused pages are never read; the rows
    past seqused_k of a last, partly used page are read and weighted by zero, so a NaN
    there poisons the output. The reference behaves as the kernel does."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, cu, used, table, max_q = _paged_step([(1, 37), (5, 20)], gen)
    kwargs = dict(cu_seqlens_q=cu, max_seqlen_q=max_q, seqused_k=used, page_table=table)
    clean, _ = flash_attn_varlen_reference(q, k, v, **kwargs, causal=True)
    unused = [p for p in range(NUM_PAGES) if p not in table.flatten().tolist()]
    k[unused], v[unused] = float("nan"), float("nan")
    out, _ = flash_attn_varlen_reference(q, k, v, **kwargs, causal=True)
    assert torch.equal(out, clean)
    last_page = int(table[0, 2])  # sequence 0: keys 32..36 of its third page used
    v[last_page, 10] = float("nan")
    out, _ = flash_attn_varlen_reference(q, k, v, **kwargs, causal=True)
    assert out[0].isnan().all() and torch.equal(out[1:], clean[1:])


def test_the_reference_holds_the_kernels_argument_checks():
    gen = torch.Generator().manual_seed(2)
    q, k, v, cu, used, table, _ = _paged_step([(1, 37)], gen)
    with pytest.raises(AssertionError, match="page_table must be int32"):
        flash_attn_varlen_reference(
            q, k, v, cu_seqlens_q=cu, seqused_k=used, page_table=table.long()
        )
    with pytest.raises(AssertionError, match="not supported with cu_seqlens_k"):
        flash_attn_varlen_reference(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, seqused_k=used, page_table=table
        )
    with pytest.raises(AssertionError, match="must be int32"):
        flash_attn_varlen_reference(
            q, k, v, cu_seqlens_q=cu.long(), seqused_k=used, page_table=table
        )


def _backend_output(name: str, rows: list[BatchRow], q, k, v, kv_cache) -> torch.Tensor:
    spec = AttentionSpec(CPU, torch.float32, torch.float32, DIM)
    backend = select_attention_backend(name, spec)
    inputs = InputBatch(
        backend,
        PAGE,
        CPU,
        max_num_tokens=128,
        max_num_seqs=8,
        max_model_len=NUM_PAGES * PAGE,
        null_block=NUM_PAGES,
    )
    step = inputs.build(rows)
    # The torch backend takes its short rows first: its tokens in its order, and back.
    starts = [0, *torch.tensor([len(r.token_ids) for r in rows]).cumsum(0).tolist()]
    flat = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in inputs._order(rows)])
    out = backend.forward(q[flat], k[flat], v[flat], kv_cache.clone(), step.attn_meta)
    return out[torch.argsort(flat)]


def test_the_flash_backend_matches_the_torch_backend_on_a_mixed_step():
    """Decodes, a prefill chunk over cached context, a whole prompt and verification
    rows in one step: the flash backend's metadata and layout (through the reference)
    give what SDPA gives, and both write the step's keys and values to their slots."""
    gen = torch.Generator().manual_seed(3)
    rows = []
    cache = torch.zeros(2, NUM_PAGES + 1, PAGE, KV_HEADS, DIM)
    cache[:, :NUM_PAGES].normal_(generator=gen)
    pages = torch.randperm(NUM_PAGES, generator=gen).tolist()
    for q_len, keys in MIXED:
        table = [pages.pop() for _ in range(-(-keys // PAGE))]
        rows.append(BatchRow([0] * q_len, keys - q_len, table, 0))
    tokens = sum(len(r.token_ids) for r in rows)
    q = torch.randn(tokens, HEADS, DIM, generator=gen)
    k = torch.randn(tokens, KV_HEADS, DIM, generator=gen)
    v = torch.randn(tokens, KV_HEADS, DIM, generator=gen)
    flash = _backend_output("flash_reference", rows, q, k, v, cache)
    sdpa = _backend_output("torch", rows, q, k, v, cache)
    assert torch.allclose(flash, sdpa, atol=1e-5)

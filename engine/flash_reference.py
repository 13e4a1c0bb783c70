"""flash-attn-4's `flash_attn_varlen_func` over a paged KV cache, in plain torch: the
same signature and semantics for the arguments the engine passes, so the flash
backend, its metadata and its cache layout run and are tested on any device
(tests/engine/test_flash_attention.py checks this against SDPA, and
scripts/gpu-check the real kernel against this).

The contract, as flash_attn/cute/interface.py (4.0.0b36) states it:
- q is [total_q, heads, dim]; cu_seqlens_q ([batch + 1], int32) splits it into
  sequences; k and v are the cache, [num_pages, page_size, kv_heads, dim];
- page_table ([batch, pages_per_seq], int32, contiguous rows) names each sequence's
  pages, and seqused_k ([batch], int32) how many keys it has; cu_seqlens_k must be
  None with a page table;
- causal masking is aligned to the bottom right: query i of a sequence with q_len
  queries and k_len keys sees keys 0 .. k_len - q_len + i;
- a page past a sequence's last used page may hold anything (NaN included): it is
  never read. Rows past seqused_k inside the last used page are read (by TMA, whole
  pages) and weighted by zero, so a NaN there poisons the output: they must be
  finite. This reference reproduces both;
- max_seqlen_q / max_seqlen_k are host integers bounding every sequence (and, under
  CUDA graphs, every replay);
- it returns (out [total_q, heads, dim] in q's dtype, lse or None).

Nothing here reads a device value back to the host, so it can stand where the kernel
stands in a step that a CUDA graph would capture. Its memory is batch x max_seqlen_k
keys: a reference for tests, not a kernel.
"""

from __future__ import annotations

import torch


def flash_attn_varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    min_seqlen_k: int | None = None,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    gather_kv_indices: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, None]:
    """flash_attn_varlen_func's parameters in its order, up to `causal`."""
    if page_table is None or seqused_k is None or cu_seqlens_q is None:
        raise NotImplementedError("the reference covers varlen queries over a paged cache")
    if any(a is not None for a in (qv, min_seqlen_k, seqused_q, gather_kv_indices)):
        raise NotImplementedError("the reference has no qv, min_seqlen_k, seqused_q or gather")
    assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
    assert page_table.dtype == torch.int32, "page_table must be int32"
    assert page_table.stride(-1) == 1, "page_table must be contiguous in the last dimension"
    for t in (cu_seqlens_q, seqused_k):
        assert t.dtype == torch.int32, "cu_seqlens_q, seqused_k must be int32"
        assert t.stride(0) == 1, "cu_seqlens_q, seqused_k must be contiguous"
    batch, pages_per_seq = page_table.shape
    total_q, heads, dim = q.shape
    num_pages, page_size, kv_heads, _ = v.shape
    assert k.shape == v.shape == (num_pages, page_size, kv_heads, dim)
    assert cu_seqlens_q.shape == (batch + 1,) and seqused_k.shape == (batch,)
    assert heads % kv_heads == 0, "num_head must be divisible by num_head_kv"
    max_q = total_q if max_seqlen_q is None else max_seqlen_q
    scale = dim**-0.5 if softmax_scale is None else softmax_scale
    device = q.device

    # Each sequence's keys as one run, [batch, keys, kv_heads, dim] in float32.
    keys = pages_per_seq * page_size
    key_pos = torch.arange(keys, device=device)
    used = seqused_k.long()[:, None]
    # Whole pages up to the last used one are read; pages past it never are.
    read = key_pos[None, :] < (used + page_size - 1) // page_size * page_size
    k_seq = k[page_table.long()].flatten(1, 2).float()
    v_seq = v[page_table.long()].flatten(1, 2).float()
    k_seq = torch.where(read[..., None, None], k_seq, 0.0)
    v_seq = torch.where(read[..., None, None], v_seq, 0.0)

    # Queries padded to [batch, max_q]: slot i of sequence b holds its query i.
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()[:, None]
    slot = torch.arange(max_q, device=device)[None, :]
    index = cu_seqlens_q[:-1].long()[:, None] + torch.minimum(slot, q_lens - 1).clamp(min=0)
    q_pad = q.float()[index.clamp(max=max(total_q - 1, 0))]  # [batch, max_q, heads, dim]

    group = heads // kv_heads
    q_pad = q_pad.view(batch, max_q, kv_heads, group, dim)
    scores = torch.einsum("bmkgd,bskd->bkgms", q_pad, k_seq) * scale
    visible = key_pos[None, None, :] < used[:, :, None]  # [batch, 1, keys]
    if causal:
        last = used - q_lens + slot  # [batch, max_q]: the last key each query sees
        visible = visible & (key_pos[None, None, :] <= last[:, :, None])
    visible = visible[:, None, None]  # [batch, 1, 1, max_q, keys]
    scores = scores.masked_fill(~visible, float("-inf"))
    # A query that sees no key gets zeros, as the kernel writes them.
    weights = torch.where(visible.any(-1, keepdim=True), scores.softmax(-1), 0.0)
    out = torch.einsum("bkgms,bskd->bmkgd", weights, v_seq).reshape(batch, max_q, heads, dim)

    # Back to the flat rows: token t is query t - cu_seqlens_q[b] of its sequence b.
    rows = torch.arange(total_q, device=device)
    seq = torch.searchsorted(cu_seqlens_q.long(), rows, right=True) - 1
    flat = out[seq, rows - cu_seqlens_q.long()[seq]]
    return flat.to(q.dtype), None

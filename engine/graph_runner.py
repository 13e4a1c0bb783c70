"""Decode and verification steps as CUDA graphs (nano-vllm's and vLLM's recipe).

On a GPU a small model's decode step is bound by the host: about a thousand kernel
launches a token, each costing more than the kernel runs. A CUDA graph replays a
whole step's kernels in one launch, but only over the memory and shapes it was
captured with. So a step of decodes (one token a row) or verifications (1 + k tokens a
row) is padded to a bucket: its rows to the step's longest query with trailing pad
tokens, and its row count up to the next bucket size with rows of pad tokens alone
(InputBatch sends both to the null block). The step is then a function of
InputBatch's persistent buffers (token ids, positions, slots) and the backend's
(page table, sequence lengths), the same memory and shapes for every step of one
bucket. Steps with a prefill chunk run eagerly, as does everything with enforce_eager.

On a CPU the same padded step runs eagerly: the tests prove there what the graphs
rely on (padded rows change no real row's bits; the buffers keep their addresses;
nothing in the step reads a value back to the host), and scripts/gpu-check proves
the capture itself on a GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from engine.attention import AttentionBackend
from engine.input_batch import BatchRow, InputBatch, ModelInputs
from engine.model import CausalLM

log = logging.getLogger("semgate.engine")

GraphKey = tuple[int, int]  # (rows, tokens a row)


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Row counts a padded step takes: 1, 2, 4, 8, 16, 32, then steps of 32, up to (and
    ending at) max_num_seqs."""
    buckets = [b for b in (1, 2, 4, 8, 16) if b < max_num_seqs]
    buckets += range(32, max_num_seqs, 32)
    return [*buckets, max_num_seqs]


class GraphRunner:
    def __init__(
        self,
        model: CausalLM,
        attention: AttentionBackend,
        kv_caches: list[torch.Tensor],
        inputs: InputBatch,
        *,
        max_num_seqs: int,
        max_query_len: int,
        capture: bool,
    ) -> None:
        """max_query_len: the longest verification row (1 + the most proposals);
        capture: CUDA graphs, else the padded step runs eagerly."""
        self.model = model
        self.attention = attention
        self.kv_caches = kv_caches
        self.inputs = inputs
        self.buckets = batch_buckets(max_num_seqs)
        self.query_lens = range(1, max_query_len + 1)
        self.capture = capture
        self.graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        # What each key's step read (addresses, shapes, host values): a replay must read
        # the same, and so, for a graphable backend, must an eager run.
        self.signatures: dict[GraphKey, tuple[Any, ...] | None] = {}
        self.hidden: torch.Tensor | None = None  # the graphs' output rows

    def plan(self, num_rows: int, query_len: int) -> GraphKey | None:
        """The bucket of a step of decodes and verifications (every token of every row
        wants its logits; query_len: the longest row), or None for a step that runs as
        it is."""
        bucket = next((b for b in self.buckets if b >= num_rows), None)
        if bucket is None or query_len not in self.query_lens:
            return None
        return bucket, query_len

    def run(self, inputs: ModelInputs, key: GraphKey) -> torch.Tensor:
        """The hidden states of a step built padded to its bucket `key` (every row
        query_len tokens, pads after the real ones; pad rows after the real rows)."""
        signature = _signature(inputs) if self.attention.graphable else None
        expected = self.signatures.setdefault(key, signature)
        if signature != expected:
            raise RuntimeError(f"a padded step of {key} read other buffers than its first")
        graph = self.graphs.get(key)
        if graph is None:
            return self.forward(inputs)
        graph.replay()
        assert self.hidden is not None
        bucket, query_len = key
        return self.hidden[: bucket * query_len]

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        """The step itself: a function of the buffers the inputs are views of."""
        return self.model(
            inputs.input_ids, inputs.positions, self.attention, self.kv_caches, inputs.attn_meta
        )

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """One graph per (bucket, query length), the largest first so that the smaller
        ones reuse its memory pool."""
        if not self.capture or not self.attention.graphable:
            return
        started = time.perf_counter()
        keys = sorted(
            ((b, q) for b in self.buckets for q in self.query_lens),
            key=lambda k: k[0] * k[1],
            reverse=True,
        )
        self.hidden = torch.empty(
            keys[0][0] * keys[0][1],
            self.model.config.hidden_size,
            dtype=self.model.embed.dtype,
            device=self.model.embed.device,
        )
        log.info("capturing %d CUDA graphs (batch sizes %s)", len(keys), self.buckets)
        pool = None
        for bucket, query_len in keys:
            inputs = self.inputs.build(pad_rows([], (bucket, query_len)))
            self.signatures[bucket, query_len] = _signature(inputs)
            self.forward(inputs)  # warm-up: kernels compiled and loaded before capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.hidden[: bucket * query_len].copy_(self.forward(inputs))
            pool = graph.pool()
            self.graphs[bucket, query_len] = graph
        torch.cuda.synchronize()
        log.info("captured %d CUDA graphs in %.2fs", len(keys), time.perf_counter() - started)


def pad_rows(rows: list[BatchRow], key: GraphKey) -> list[BatchRow]:
    """Rows padded to the bucket `key`: pad tokens after each row's own to query_len, then
    rows of pad tokens alone (see InputBatch)."""
    bucket, query_len = key
    padded = [row._replace(num_pad=query_len - len(row.token_ids)) for row in rows]
    return padded + [BatchRow([], 0, [], 0, num_pad=query_len)] * (bucket - len(rows))


def _signature(inputs: ModelInputs) -> tuple[Any, ...]:
    """Where each input tensor lies and its shape, and every host value of the metadata:
    what a captured graph has baked in."""
    parts: list[Any] = []
    values = [inputs.input_ids, inputs.positions]
    values += [getattr(inputs.attn_meta, f.name) for f in dataclasses.fields(inputs.attn_meta)]
    for value in values:
        if isinstance(value, torch.Tensor):
            parts.append((value.data_ptr(), tuple(value.shape)))
        else:
            parts.append(value)
    return tuple(parts)
